"""Named ranges around the phases of a training step, for Nsight (NVTX) and torch.profiler.

`phase("forward")` costs a few microseconds when no profiler is attached. The names are the ones
the profiling tables group by: data, forward, backward, optimizer, eval, grow.
"""

from growlm.profile import PHASES, nvtx_range as phase

__all__ = ["PHASES", "phase"]
