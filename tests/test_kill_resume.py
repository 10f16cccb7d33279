"""A training job killed with SIGKILL at three points resumes each time and ends bit-identical; a wsd job
killed in its decay too, with the checkpoint where its decay began."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

JOB = textwrap.dedent('''
    import os, signal, sys
    import numpy as np, torch
    from safetensors.torch import save_file
    from growlm.model import build_model
    from growlm.train import train
    from growlm.train_config import TrainConfig

    torch.set_num_threads(1)
    out = sys.argv[1]
    kill_at = int(os.environ.get("KILL_AT", "0"))
    rng = np.random.default_rng(0)
    tokens = (np.arange(20000) % 97 + rng.integers(0, 3, 20000)).astype(np.uint16)
    model = build_model(seed=0, n_embd=32, n_layer=2, vocab_size=128, n_positions=16, head_dim=8)
    cfg = TrainConfig(tokens=8 * 16 * 40, batch_size=8, context=16, lr=3e-3, warmup_steps=4,
                      eval_interval=10, eval_tokens=512, checkpoint_every=int(os.environ.get("EVERY", "5")),
                      dense_log_steps=0, seed=3, schedule=os.environ.get("SCHEDULE", "cosine"), wsd_decay=0.2)

    def maybe_die(step):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    train(model, tokens, tokens, cfg, ckpt_dir=out + "/ckpt", ledger_path=out + "/ledger.csv",
          step_callback=maybe_die)
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              out + "/final.safetensors")
''')


def run_job(out: Path, kill_at: int = 0, **env_vars) -> subprocess.CompletedProcess:
    env = {**os.environ, "KILL_AT": str(kill_at), **env_vars}
    return subprocess.run([sys.executable, "-c", JOB, str(out)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_sigkill_at_three_points_then_resume_is_exact(tmp_path):
    clean = run_job(tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr
    reference = load_file(tmp_path / "clean" / "final.safetensors")

    out = tmp_path / "killed"
    for kill_at in (3, 12, 28):  # before the first checkpoint, between two, near the end
        proc = run_job(out, kill_at)
        assert proc.returncode == -signal.SIGKILL, (kill_at, proc.returncode, proc.stderr[-2000:])
        assert not (out / "final.safetensors").exists()
    last = run_job(out)
    assert last.returncode == 0, last.stderr
    assert "resumed from checkpoint step_00000025" in last.stdout
    resumed = load_file(out / "final.safetensors")
    assert resumed.keys() == reference.keys()
    for name in reference:
        assert torch.equal(resumed[name], reference[name]), name
    # the ledger survived the kills: one row per evaluation, none repeated, and every column but the
    # machine's measurements (wall time, peak memory) is the uninterrupted run's
    import csv

    def rows(path):
        return [{k: v for k, v in r.items() if k not in ("wall_s", "peak_mem_mb")} for r in csv.DictReader(open(path))]

    killed, clean_rows = rows(out / "ledger.csv"), rows(tmp_path / "clean" / "ledger.csv")
    assert [r["step"] for r in killed] == ["0", "10", "20", "30", "40"]
    assert killed == clean_rows


def test_a_wsd_job_killed_in_its_decay_resumes_to_the_same_numbers(tmp_path):
    """40 steps under wsd, the last fifth decaying (from step 32), a checkpoint every 7 steps: killed in
    the decay with the last checkpoint before it (step 28: the resumed run passes the decay's start again)
    and after it (step 35: the checkpoint where the decay began was left by the run before), it ends with
    the uninterrupted run's weights, ledger and checkpoint at the decay's start, bit for bit."""
    import csv
    import json

    wsd = {"SCHEDULE": "wsd", "EVERY": "7"}
    clean = run_job(tmp_path / "clean", **wsd)
    assert clean.returncode == 0, clean.stderr
    out = tmp_path / "killed"
    for kill_at in (34, 37):
        proc = run_job(out, kill_at, **wsd)
        assert proc.returncode == -signal.SIGKILL, (kill_at, proc.returncode, proc.stderr[-2000:])
    last = run_job(out, **wsd)
    assert last.returncode == 0, last.stderr
    assert "resumed from checkpoint step_00000035" in last.stdout
    for name in ("final.safetensors", "ckpt/decay_start/model.safetensors", "ckpt/decay_start/optimizer.safetensors"):
        reference, resumed = load_file(tmp_path / "clean" / name), load_file(out / name)
        assert resumed.keys() == reference.keys()
        assert all(torch.equal(resumed[k], reference[k]) for k in reference), name
    state = json.loads((out / "ckpt" / "decay_start" / "state.json").read_text())
    assert state["step"] == 32 and state["rows"][-1]["step"] == 32  # evaluated where the decay begins

    def rows(path):
        return [{k: v for k, v in r.items() if k not in ("wall_s", "peak_mem_mb")} for r in csv.DictReader(open(path))]

    killed = rows(out / "ledger.csv")
    assert killed == rows(tmp_path / "clean" / "ledger.csv")
    assert [r["step"] for r in killed] == ["0", "10", "20", "30", "32", "40"]  # and one where the decay begins
    lrs = [float(r["lr"]) for r in killed]  # the rate of the step before each row: the peak until the decay
    assert lrs[2] == lrs[3] == lrs[4] == 3e-3 and lrs[5] < 3e-3
