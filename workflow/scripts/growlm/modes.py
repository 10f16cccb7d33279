"""The mode a training job computed in, and what a change of mode means for its numbers.

A training run's result is fixed by its settings, its initial weights and its data (its identity,
`growlm.checkpoint.run_identity`): on a CPU, a run killed and resumed is bit for bit the run left
alone. Three settings rerun nothing and are not part of that identity, because they decide how the
steps run, not what they compute - yet each changes the order in which floating-point sums are
added, and so the last digits of every loss and weight:

* `train.compile`: torch.compile's inductor fuses the operations of a step into generated kernels and
  reduces in its own order;
* `train.compile_ramps`: the same for a grown model's ramp steps (a model without ramps is untouched);
* `train.threads`: on a CPU, the threads among which a matrix product splits its sums (on a GPU the
  device computes, and the CPU threads do not enter).

Measured (`bench/modes.py`, M_0 of the tiny experiment's shape on a CPU): a second run in one mode repeats
the first bit for bit; on 2 threads, or compiled, the final validation loss moves by 1e-8 relative
(4.750983566, 4.750983655, 4.750983536) and single weights by up to 6e-4 of their tensor's largest (AdamW
divides by the gradients' size, so it carries the rounding of a near-zero gradient into whole steps).

On a GPU the processes a job runs in (`resources.gpu`: their gradients are averaged in another order)
count too. These differences are rounding, orders of magnitude below the spread between seeds, so
growlm does not retrain an experiment when they change; but two arms computed in different modes do
not differ by their method alone, so every number says its mode: a short text (`run_mode`) in every
ledger row, in the job's growlm.json (`train.mode`: every mode its rows were computed in), in the
comparison (`m0_mode`, `m1_mode`: `arm_mode`) and on the report's first page, and a resume that changes
the mode says so in one line (`resume_line`).

Torch-free: the comparison and the report read modes without torch.
"""

from __future__ import annotations

import re

NOT_RECORDED = "not recorded"  # a ledger row written by a growlm older than modes


def run_mode(device: str, compile_mode: str | None, *, threads: int, world: int = 1,
             ramps: bool | None = None) -> str:
    """The mode of a training run: "eager, 2 CPU threads", "compiled, 1 CPU thread", "compiled
    (max-autotune), on cuda, 4 processes". `compile_mode`: torch.compile's mode, None for eager;
    `ramps`: for a model with growth-mask ramps, whether they are compiled too (`train.compile_ramps`),
    None for a model without ramps (the setting does not touch it)."""
    kind = device.split(":")[0]
    notes = [m for m in (compile_mode if compile_mode not in (None, "default") else None,
                         None if ramps is None or not compile_mode else f"ramps {'compiled' if ramps else 'eager'}")
             if m]
    parts = ["compiled" + (f" ({', '.join(notes)})" if notes else "") if compile_mode else "eager"]
    parts.append(f"{threads} CPU thread{'s' if threads != 1 else ''}" if kind == "cpu" else f"on {kind}")
    if world > 1:
        parts.append(f"{world} processes")
    return ", ".join(parts)


def job_mode(modes) -> str:
    """One job's modes (those of its ledger rows, in order) as one text: "eager, 2 CPU threads", or for a
    run resumed in another mode "eager, 2 CPU threads then compiled, 2 CPU threads"."""
    return " then ".join(dict.fromkeys(m or NOT_RECORDED for m in modes)) or NOT_RECORDED


def _without_ramps(mode: str) -> tuple[str, str | None]:
    """A mode's text without its ramps note, and the note ("ramps eager"; None for a model without ramps)."""
    m = re.fullmatch(r"(eager|compiled)(?: \((.*?)\))?(, .*)?", mode)
    if not m:
        return mode, None
    notes = [n for n in (m.group(2) or "").split(", ") if n]
    ramps = next((n for n in notes if n.startswith("ramps ")), None)
    rest = [n for n in notes if n != ramps]
    return m.group(1) + (f" ({', '.join(rest)})" if rest else "") + (m.group(3) or ""), ramps


def one_mode(modes) -> str | None:
    """The one mode that `modes` (each one run's `run_mode`) share, or None when they differ. The ramps note
    counts among the models that have ramps only: M_0 "compiled" and a refinement "compiled (ramps eager)"
    ran under one setting of every key (train.compile_ramps does not touch a model without ramps), and the
    mode they share is the refinement's, which says all of it."""
    modes = list(modes)
    split = [_without_ramps(m) for m in modes]
    if not modes or len({base for base, _ in split}) != 1 or len({r for _, r in split if r}) > 1:
        return None
    return next((m for m, (_, ramps) in zip(modes, split) if ramps), modes[0])


def arm_mode(parts: dict[str, list[str]]) -> str:
    """The mode of an arm made by several jobs, `parts` {what: the `job_mode` of each of its jobs} in order
    ("members", "growth", "refinement"): the one mode when they all share it (`one_mode`), else each part's."""
    every = [m for modes in parts.values() for m in modes]
    if not every:
        return NOT_RECORDED
    shared = None if any(" then " in m for m in every) else one_mode(every)
    if shared:
        return shared
    return "; ".join(f"{what}: {' and '.join(dict.fromkeys(modes))}" for what, modes in parts.items() if modes)


def experiment_mode(modes) -> str | None:
    """The one mode of an experiment's arms (their `arm_mode`s), or None when its models were not all computed
    in one (an arm's parts in different modes, a job resumed in another, or arms that differ)."""
    modes = list(modes)
    if any(" then " in m or ": " in m or m == NOT_RECORDED for m in modes):
        return None
    return one_mode(modes)


def resume_line(saved: str | None, now: str, step: int) -> str | None:
    """What a resume says when the checkpoint was computed in another mode than this run's (None when
    it was not, or when the checkpoint does not say: a growlm older than modes wrote it)."""
    if not saved or saved == now:
        return None
    return (f"resuming at step {step} in another mode: the steps so far were computed {saved}, the rest will be "
            f"{now} (train.compile, train.compile_ramps or train.threads changed): the result differs in its last "
            f"digits from a run in one mode; the ledger, growlm.json, the comparison and the report name both modes")
