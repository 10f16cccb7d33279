"""Named ranges around the phases of a training step: NVTX (for Nsight) and torch.profiler.

`phase("forward")` costs a few microseconds when no profiler is attached. The names are the ones
the profiling tables group by: data, forward, backward, optimizer, eval, grow.
"""

from __future__ import annotations

import contextlib

import torch

try:  # nvtx is a declared dependency; keep training alive where it is missing
    import nvtx as _nvtx
except ImportError:  # pragma: no cover
    _nvtx = None

PHASES = ("data", "forward", "backward", "optimizer", "eval", "grow")


@contextlib.contextmanager
def phase(name: str):
    with contextlib.ExitStack() as stack:
        if _nvtx is not None:
            stack.enter_context(_nvtx.annotate(name, domain="growlm"))
        stack.enter_context(torch.profiler.record_function(name))
        yield
