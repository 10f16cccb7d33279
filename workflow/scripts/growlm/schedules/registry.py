"""The schedules' implementations, by name: what the grow job dispatches a schedule to.

A schedule is described once, torch-free, in `growlm.methods.OPERATORS` (axis "schedule": its options,
defaults, the settings its grow job reads, its check). `runs(name)` registers the function that runs it:

    @runs("my_schedule")
    def run(*, my_schedule: dict, model: dict, seed, train_file, val_file, tokenizer_dir, out_dir):
        ...
        return grown_model, {"flops": ..., "wall_s": ..., "stages": [...]}

It takes its description's `settings` (its options under its own name) and the files of the grow job as
keywords, trains what it trains (under `out_dir`, beside the grown model) and returns the grown model
and its cost: FLOPs and wall time (compilation left out) are the growth cost the comparison counts,
`stages` its record's. The grow job (`growlm.jobs.grow.grow_schedule`) saves the model and writes the
record, as for every grow job.
"""

from __future__ import annotations

from typing import Callable

from growlm.errors import GrowlmError
from growlm.methods import OPERATORS, SCHEDULE

RUNNERS: dict[str, Callable] = {}


def runs(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as what runs schedule `name`, which must be described (axis "schedule")."""

    def wrap(fn: Callable) -> Callable:
        spec = OPERATORS.get(name)
        if spec is None or spec.axis != SCHEDULE:
            raise GrowlmError(f"{fn.__name__} runs {name!r}, which is not a described schedule "
                              f"(growlm.methods.OPERATORS, axis {SCHEDULE!r})")
        RUNNERS[name] = fn
        return fn

    return wrap
