"""What the job functions share: the log line, the device, where checkpoints live."""

from __future__ import annotations

import sys
import time
from pathlib import Path


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
