"""A training job killed with SIGKILL at three points resumes each time and ends bit-identical; a wsd job
killed in its decay too, with the checkpoint where its decay began.

Each job is a process of its own, killed with SIGKILL: a fork of one server process that imported torch
and growlm once for the file and then waits, without having trained or run any torch operation (the
fork starts from that same clean state every time: nothing of a job reaches the next but its files).
Each job would otherwise pay the ~4 s import of torch and transformers for a fraction of a second of
training."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SERVER = textwrap.dedent('''
    import json, os, signal, sys, traceback
    import numpy as np, torch
    from safetensors.torch import save_file
    from growlm.model import build_model
    from growlm.train import train
    from growlm.train_config import TrainConfig

    def job(out, kill_at=0, every=5, schedule="cosine"):
        torch.set_num_threads(1)
        rng = np.random.default_rng(0)
        tokens = (np.arange(20000) % 97 + rng.integers(0, 3, 20000)).astype(np.uint16)
        model = build_model(seed=0, n_embd=32, n_layer=2, vocab_size=128, n_positions=16, head_dim=8)
        cfg = TrainConfig(tokens=8 * 16 * 40, batch_size=8, context=16, lr=3e-3, warmup_steps=4,
                          eval_interval=10, eval_tokens=512, checkpoint_every=every,
                          dense_log_steps=0, seed=3, schedule=schedule, wsd_decay=0.2)

        def maybe_die(step):
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

        train(model, tokens, tokens, cfg, ckpt_dir=out + "/ckpt", ledger_path=out + "/ledger.csv",
              step_callback=maybe_die)
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
                  out + "/final.safetensors")

    for line in sys.stdin:  # one job a line: {"log": file for its output, "job": job's arguments}
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the job: its own process, its output to its log
            log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = 0
            try:
                job(**request["job"])
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)  # -9: killed by SIGKILL
''')


class Job:
    """What run_job returns: the job's exit status (-9 when SIGKILL ended it) and its output."""

    def __init__(self, returncode: int, output: str):
        self.returncode, self.stdout = returncode, output


@pytest.fixture(scope="module")
def run_job(tmp_path_factory):
    """run_job(out, kill_at=0, every=5, schedule="cosine"): one training job into `out`, killed with
    SIGKILL after step `kill_at` (0: never), with a checkpoint every `every` steps."""
    logs = tmp_path_factory.mktemp("job_logs")
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    count = 0

    def run(out: Path, kill_at: int = 0, every: int = 5, schedule: str = "cosine") -> Job:
        nonlocal count
        count += 1
        log = logs / f"{count}.log"
        server.stdin.write(json.dumps({"log": str(log), "job": {"out": str(out), "kill_at": kill_at, "every": every,
                                                                 "schedule": schedule}}) + "\n")
        server.stdin.flush()
        said = server.stdout.readline()
        assert said, "the job server ended"
        return Job(int(said), log.read_text())

    yield run
    server.stdin.close()
    assert server.wait(timeout=60) == 0


def test_sigkill_at_three_points_then_resume_is_exact(run_job, tmp_path):
    clean = run_job(tmp_path / "clean")
    assert clean.returncode == 0, clean.stdout
    reference = load_file(tmp_path / "clean" / "final.safetensors")

    out = tmp_path / "killed"
    for kill_at in (3, 12, 28):  # before the first checkpoint, between two, near the end
        proc = run_job(out, kill_at)
        assert proc.returncode == -signal.SIGKILL, (kill_at, proc.returncode, proc.stdout[-2000:])
        assert not (out / "final.safetensors").exists()
    last = run_job(out)
    assert last.returncode == 0, last.stdout
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


def test_a_wsd_job_killed_in_its_decay_resumes_to_the_same_numbers(run_job, tmp_path):
    """40 steps under wsd, the last fifth decaying (from step 32), a checkpoint every 7 steps: killed in
    the decay with the last checkpoint before it (step 28: the resumed run passes the decay's start again)
    and after it (step 35: the checkpoint where the decay began was left by the run before), it ends with
    the uninterrupted run's weights, ledger and checkpoint at the decay's start, bit for bit."""
    import csv

    wsd = {"schedule": "wsd", "every": 7}
    clean = run_job(tmp_path / "clean", **wsd)
    assert clean.returncode == 0, clean.stdout
    out = tmp_path / "killed"
    for kill_at in (34, 37):
        proc = run_job(out, kill_at, **wsd)
        assert proc.returncode == -signal.SIGKILL, (kill_at, proc.returncode, proc.stdout[-2000:])
    last = run_job(out, **wsd)
    assert last.returncode == 0, last.stdout
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
