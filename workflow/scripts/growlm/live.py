"""Live training curves: every training job writes its curve to TensorBoard (and W&B) as it trains.

`train.log_to: [tensorboard]` (or `wandb`) makes each training job, members, M_0, every refinement,
write its training loss, validation loss, learning rate, tokens per second and cumulative training
FLOPs while it runs, one run per model under the experiment's `live/` folder
(`results/live/<model path>`, as under `results/models/`), so that

    tensorboard --logdir results/live

shows M_0 and every M_1 side by side. TensorBoard's step axis is the cumulative training FLOPs, with
an M_1's members and growth counted: an M_1's curve starts where its members' cost ends
(`offset_flops`, from the grow job's `growth.json`), as in the report's loss-against-FLOPs figure. The
ledger stays the source of every reported number; these curves are for watching.

How it reaches the loop: the rule passes the settings as a params function of its output (so
Snakemake leaves them out of the rerun trigger: changing `train.log_to` reruns nothing), the job puts
them in the environment (`session`), and `growlm.train.train` asks `from_env` for a logger on rank 0,
so a job under torchrun logs too. The loop calls `row` where it writes a ledger row and `progress`
where it writes its progress line.

W&B runs offline unless `WANDB_MODE` says otherwise (`wandb sync` uploads them later), in the run's
folder, with the project `growlm` (`WANDB_PROJECT`), the experiment as group and the model path as
name.

Torch-free at import: the writers are imported when a job opens its logger. `tracker_problems` names
a tracker that is not installed, before any job.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import json
import os
import re
from pathlib import Path

ENV = "GROWLM_LIVE"
# tracker -> the module that must be importable
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb"}
EXTRA = {"tensorboard": "growlm's eval extra (`.venv/bin/pip install -e '.[eval]'`; setup.sh does)",
         "wandb": "`.venv/bin/pip install wandb`"}


def tracker_problems(log_to) -> list[str]:
    """One line per tracker of `train.log_to` that is not installed."""
    return [f"train.log_to: {t} is not installed; install it with {EXTRA[t]}, or leave it out of train.log_to"
            for t in log_to or [] if t in TRACKERS and importlib.util.find_spec(TRACKERS[t]) is None]


class LiveCurves:
    """The writers of one training run. `flops_at(step)`: the run's own cumulative training FLOPs at
    a step (for progress lines, which have no ledger row); `offset_flops`: what the model cost before
    this run (an M_1's members and growth), added to every point."""

    def __init__(self, *, to, run_dir, name: str, group: str, offset_flops: float = 0.0, flops_at=None):
        self.to, self.run_dir, self.name, self.group = list(to), Path(run_dir), name, group
        self.offset, self.flops_at = float(offset_flops), flops_at
        self.tb = self.wandb = None
        self.opened = False
        self.last = None  # the previous ledger row, for tokens/s between two rows

    # -- the writers, opened at the first point (its step tells a resumed run from a new one) ----
    def _open(self, first_step: int, first_flops: int) -> None:
        self.opened = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if "tensorboard" in self.to:
            from torch.utils.tensorboard import SummaryWriter  # optional dependency: the tensorboard package (eval extra)

            if first_step == 0:  # a new run: an earlier run's events in this folder are stale
                for old in self.run_dir.glob("events.out.tfevents.*"):
                    old.unlink()
            # a resumed run: TensorBoard hides the earlier events from this point on (they are redone)
            self.tb = SummaryWriter(log_dir=str(self.run_dir), purge_step=first_flops if first_step else None)
        if "wandb" in self.to:
            import wandb  # optional dependency (`pip install wandb`)

            run_id = re.sub(r"[^A-Za-z0-9]", "-", self.name)[-40:] + "-" + hashlib.sha1(
                f"{self.group}/{self.name}".encode()).hexdigest()[:8]
            self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "growlm"), group=self.group,
                                    name=self.name, id=run_id, resume="allow", dir=str(self.run_dir),
                                    mode=os.environ.get("WANDB_MODE", "offline"), reinit="finish_previous")
            self.wandb.define_metric("flops")
            self.wandb.define_metric("*", step_metric="flops")
        atexit.register(self.close)

    def _write(self, step: int, flops: float, values: dict) -> None:
        total = int(round(self.offset + flops))
        if not self.opened:
            self._open(step, total)
        values = {k: float(v) for k, v in values.items() if v is not None and v != ""}
        values["train/step"] = float(step)
        if self.tb is not None:
            for tag, value in values.items():
                self.tb.add_scalar(tag, value, global_step=total)
            self.tb.add_scalar("cost/flops", float(total), global_step=total)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({**values, "flops": total})

    # -- what the training loop calls -------------------------------------------------------------
    def row(self, row: dict) -> None:
        """A ledger row (growlm.train.LEDGER_COLUMNS), as it is written."""
        values = {"loss/train": row.get("train_loss"), "loss/val": row.get("val_loss"), "train/lr": row.get("lr"),
                  "train/tokens": row.get("tokens")}
        last = self.last
        if last is not None and float(row["wall_s"]) > float(last["wall_s"]) and row["tokens"] > last["tokens"]:
            values["train/tokens_per_s"] = (row["tokens"] - last["tokens"]) / (float(row["wall_s"])
                                                                               - float(last["wall_s"]))
        self.last = row
        self._write(int(row["step"]), float(row["flops"]), values)

    def progress(self, step: int, train_loss: float | None, lr: float, tokens_per_s: float) -> None:
        """A progress line: the running training loss, the learning rate and the measured tokens/s."""
        if self.flops_at is None:
            return
        values = {"train/lr": lr, "train/tokens_per_s": tokens_per_s or None}
        if self.last is None or int(self.last["step"]) != step:  # the ledger row of this step has the loss
            values["loss/train"] = train_loss
        self._write(step, float(self.flops_at(step)), values)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def from_env(flops_at=None) -> LiveCurves | None:
    """The logger the job's environment asks for (`session`), or None."""
    text = os.environ.get(ENV)
    if not text:
        return None
    s = json.loads(text)
    return LiveCurves(to=s["to"], run_dir=s["dir"], name=s["name"], group=s.get("experiment", ""),
                      offset_flops=s.get("offset_flops", 0.0), flops_at=flops_at)


@contextlib.contextmanager
def session(settings: dict | None, *, offset_flops: float = 0.0):
    """Within it, the training loop of this process and of its children (torchrun) writes live curves
    as `settings` say (`{"to", "dir", "name", "experiment"}`; None or no tracker: nothing)."""
    if not settings or not settings.get("to"):
        yield
        return
    old = os.environ.get(ENV)
    os.environ[ENV] = json.dumps({**settings, "offset_flops": float(offset_flops)})
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old
