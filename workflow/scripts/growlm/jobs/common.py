"""What the job functions share: the log line, the device, where checkpoints live, live curves."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from growlm import live
from growlm.compare import growth_cost
from growlm.errors import read_json


def log(msg: str) -> None:
    """One timestamped line on stdout (the job's log file)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def warn(msg: str) -> None:
    """A warning in the job's log and in the terminal where Snakemake runs (a legal but surprising
    value should not hide in a log file)."""
    log(f"warning: {msg}")
    print(f"growlm: warning: {msg}", file=sys.__stderr__, flush=True)


def checkpoint_dir_for(model_dir: str | Path) -> Path:
    """Checkpoints live beside `results/models/...` under `results/checkpoints/...`, never inside
    a declared output (Snakemake deletes a failed job's outputs)."""
    model_dir = Path(model_dir)
    parts = list(model_dir.parts)
    if "models" in parts:
        parts[parts.index("models")] = "checkpoints"
        return Path(*parts)
    return model_dir.with_name(model_dir.name + ".ckpt")


def live_curves(settings: dict | None, *, grown_dir=None):
    """The training job's live curves (`train.log_to`, `growlm.live`), as its rule's `live` params give
    them; a refinement's start at the cost of its grown model's members and growth (`growth.json` in
    `grown_dir`), where the report's curves of M_1 start."""
    offset = 0.0
    if settings and settings.get("to") and grown_dir is not None:
        cost = growth_cost(read_json(Path(grown_dir) / "growth.json"))
        offset = (0.0 if cost["unknown"] else cost["small_flops"]) + cost["growth_flops"]  # unknown members: free
    return live.session(settings, offset_flops=offset)
