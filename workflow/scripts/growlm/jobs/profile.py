"""The job of the profiling stage: a few training steps of one model kind under a profiler.

It runs `python -m growlm.profiling.workload` under `growlm.profiling.driver.profile_run`, which
falls back to torch.profiler where the requested Nsight tool or a GPU is missing, and writes the
tidy tables into the job's folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from growlm.console import log
from growlm.profiling.driver import profile_run
from growlm.tokenizer import vocab_size


def profile(*, tool: str, kind: str, train: dict, model: dict, tokens_file, tokenizer_dir, out_dir,
            settings: dict, grown_dir: str | None = None, threads: int = 1) -> dict:
    """Profile `settings['steps']` steps of `kind` ('small', 'baseline' or 'refine') after
    `settings['warmup_steps']` with `tool` ('nsys' or 'ncu')."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train.json").write_text(json.dumps(train))
    (out_dir / "model.json").write_text(json.dumps(model))
    cmd = [sys.executable, "-m", "growlm.profiling.workload", "--kind", kind, "--train", str(out_dir / "train.json"),
           "--model", str(out_dir / "model.json"), "--width", str(model["n_embd"]), "--depth", str(model["n_layer"]),
           "--vocab", str(vocab_size(tokenizer_dir)), "--tokens", str(tokens_file),
           "--steps", str(settings["warmup_steps"] + settings["steps"] + 1), "--threads", str(threads)]
    if grown_dir:
        cmd += ["--grown", str(grown_dir)]
    run = profile_run(tool, cmd, out_dir, steps=settings["steps"], warmup=settings["warmup_steps"],
                      kernel_filter=settings.get("ncu_kernel_filter"), launch_count=settings["ncu_launch_count"])
    log(f"{tool} requested; tables made by {run['profiler']}"
        + (f" (fallback: {run['fallback_reason']})" if run["fallback_reason"] else ""))
    return run
