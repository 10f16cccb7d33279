"""The worked 8-GPU example of docs/gpu-and-clusters.md: every device busy, each job on devices of its own.

A fake 8-GPU node inside a SLURM allocation, as `salloc --gres=gpu:8` leaves it (SLURM_JOB_ID set,
CUDA_VISIBLE_DEVICES=0,...,7; the CPU trains, CUDA_VISIBLE_DEVICES is what a job would see), and a local
run there: the tiny experiment with six members asking one GPU each and M_0 asking two
(`--set-resources train_baseline:gpu=2`), members and M_0 trained long enough to overlap, from the shared
tiny run's corpus and tokenizer. Snakemake is given the allocation's eight GPUs without being told (the
Snakefile counts them), the six members and M_0 start together and hold all eight devices at once, each
its own (inside the allocation growlm still places every job: SLURM placed the run, not the jobs), every
job's growlm.json says where it ran, and the numbers of the jobs whose places differ most equal those of the
same jobs run one at a time on a machine without GPUs: M_0 (two devices) and the members on the first and
on the last device a member got (which member gets which device is up to the order the jobs start in).

150,000 tokens a job are enough to overlap: the seven jobs start together and write their first timed
line within a second of each other (after importing torch side by side), and a member's 585 steps then
take some 2 CPU seconds: 7 s while the seven jobs share two quiet cores, over 30 s on two busy ones.
"""

from __future__ import annotations

import csv
import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from conftest import TINY, copy_run, run_snakemake

pytestmark = pytest.mark.slow

OVERLAY = ("n: [6]\nmethods: [[hyperclone, zero_block]]\nresources: {gpu: 1}\n"
           "train: {small: {tokens: 150000}, large: {tokens: 150000}, checkpoint_every: 100000}\n")
MEMBERS = [f"results/tiny/models/small/d16_L1/s0/m{i}" for i in range(1, 7)]
BASELINE = "results/tiny/models/baseline/d32_L2/t150000_lr0.003/s0"
DEVICES = [str(i) for i in range(8)]
TIMING = {"wall_s", "tokens_per_s", "peak_mem_mb", "compile_s", "mfu"}


def fresh_copy(tiny_run: Path, dest: Path) -> Path:
    """The tiny run's folder with its corpus, tokenizer and tokens, and no models."""
    copy_run(tiny_run, dest, tiny=("models", "checkpoints", "eval", "report", "profile"))
    (dest / "eight.yaml").write_text(OVERLAY)
    return dest


def intervals(output: str) -> list[dict]:
    """Every finished job in Snakemake's output: {"rule", "wildcards", "start", "end"} (the "[date]" lines
    before each job's block and before its "Finished jobid")."""
    stamp, rule, jobs, done = None, None, {}, []
    current = None
    for raw in output.splitlines():
        line = raw.strip()
        if m := re.match(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$", line):
            stamp = datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
        elif m := re.match(r"^(?:local)?rule (\w+):$", line):
            rule = m.group(1)
        elif m := re.match(r"^jobid: (\d+)$", line):
            current = jobs[int(m.group(1))] = {"rule": rule, "start": stamp, "wildcards": {}}
        elif line.startswith("wildcards:") and current is not None:
            current["wildcards"] = dict(w.split("=", 1) for w in line.split(":", 1)[1].strip().split(", "))
        elif m := re.match(r"^Finished jobid: (\d+)", line):
            done.append({**jobs[int(m.group(1))], "end": stamp})
    return done


def log_seconds(log: str) -> list[int]:
    """The times of a job log's timed lines ("[HH:MM:SS] ..."), in seconds of the day, in order."""
    return [int(h) * 3600 + int(m) * 60 + int(s) for h, m, s in re.findall(r"^\[(\d\d):(\d\d):(\d\d)\]", log, re.M)]


def ledger(folder: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(open(folder / "ledger.csv"))]


def test_eight_gpus_inside_an_allocation_all_busy_each_job_on_its_own(tiny_run, tmp_path, monkeypatch):
    targets = [f"{m}/model.safetensors" for m in [*MEMBERS, BASELINE]]
    # eight fake GPUs of a SLURM allocation: six members at once, M_0 on two
    wd = fresh_copy(tiny_run, tmp_path / "eight_gpus")
    with monkeypatch.context() as allocation:
        allocation.setenv("SLURM_JOB_ID", "99")
        allocation.setenv("CUDA_VISIBLE_DEVICES", ",".join(DEVICES))
        allocation.setenv("GROWLM_GPU_LOCKS", str(tmp_path / "locks"))
        proc = run_snakemake(wd, *targets, "--cores", "8", "--set-resources", "train_baseline:gpu=2",
                             "--configfile", str(TINY), "eight.yaml")
    output = proc.stdout + proc.stderr
    assert re.search(r"Provided resources: .*gpu=\D*8", output), output[-3000:]  # counted by the Snakefile

    where = {}
    for folder in [*MEMBERS, BASELINE]:
        meta = json.loads((wd / folder / "growlm.json").read_text())
        (rank,) = meta["where"]["ranks"]
        where[folder] = rank["visible_devices"]
    held = [d for folder in [*MEMBERS, BASELINE] for d in where[folder].split(",")]
    assert sorted(held) == DEVICES, where  # a device each, M_0 two: every device, none twice

    jobs = intervals(output)
    small = [j for j in jobs if j["rule"] == "train_small"]
    assert len(small) == 6, jobs
    # all eight devices held at one moment: every job claimed its devices before its first timed line and
    # held them past its last one, so a second after the latest first line that is not after the earliest
    # last line, all of them were held
    logs = [wd / f"results/tiny/logs/train_small/d16_L1_s0_m{i}.log" for i in range(1, 7)]
    logs.append(wd / "results/tiny/logs/train_baseline/d32_L2_t150000_lr0.003_s0.log")
    spans = [log_seconds(log.read_text()) for log in logs]
    assert max(s[0] for s in spans) + 1 <= min(s[-1] for s in spans), spans
    log = logs[-1].read_text()
    assert f"GPUs {where[BASELINE]} of {','.join(DEVICES)} claimed for this job" in log

    # one job at a time, no GPUs: the reference numbers of M_0 and of the members on the first and the last
    # device a member held
    by_device = sorted(MEMBERS, key=lambda folder: int(where[folder]))
    compared = [by_device[0], by_device[-1], BASELINE]
    monkeypatch.setenv("GROWLM_GPUS", "")
    seq = fresh_copy(tiny_run, tmp_path / "one_at_a_time")
    run_snakemake(seq, *[f"{m}/model.safetensors" for m in compared], "--cores", "1", "--configfile", str(TINY),
                  "eight.yaml")
    for folder in compared:
        assert ledger(wd / folder) == ledger(seq / folder), folder
        assert (wd / folder / "model.safetensors").read_bytes() == (seq / folder / "model.safetensors").read_bytes()
