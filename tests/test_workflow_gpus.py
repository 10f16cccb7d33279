"""The workflow on a machine with four GPUs: members train side by side, each on a device of its own.

A fake machine of four devices (GROWLM_GPUS=0,1,2,3; the CPU trains, CUDA_VISIBLE_DEVICES is what a
job would see): the tiny experiment with four members asking one GPU each and M_0 asking two, from the
shared tiny run's corpus and tokenizer. Snakemake is given the machine's four GPUs without being told
(the Snakefile counts them), the four members start together on four different devices, M_0 runs on
two devices that no job running beside it holds, every job's growlm.json says where it ran, and every
number equals that of the same jobs run one at a time on a machine without GPUs.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from conftest import TINY, run_snakemake

pytestmark = pytest.mark.slow

OVERLAY = "n: [4]\nmethods: [[hyperclone, zero_block]]\nresources: {gpu: 1}\n"
MEMBERS = [f"results/tiny/models/small/d16_L1/s0/m{i}" for i in (1, 2, 3, 4)]
BASELINE = "results/tiny/models/baseline/d32_L2/t24000_lr0.003/s0"
TIMING = {"wall_s", "tokens_per_s", "peak_mem_mb", "compile_s", "mfu"}


def fresh_copy(tiny_run: Path, dest: Path) -> Path:
    """The tiny run's folder with its corpus, tokenizer and tokens, and no models."""
    shutil.copytree(tiny_run, dest, symlinks=True)
    for made in ("models", "checkpoints", "eval", "report", "profile"):
        shutil.rmtree(dest / "results" / "tiny" / made, ignore_errors=True)
    (dest / "four.yaml").write_text(OVERLAY)
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


def test_members_train_side_by_side_on_their_own_devices(tiny_run, tmp_path, monkeypatch):
    targets = [f"{m}/model.safetensors" for m in [*MEMBERS, BASELINE]]
    # one job at a time, no GPUs: the reference numbers
    seq = fresh_copy(tiny_run, tmp_path / "one_at_a_time")
    monkeypatch.setenv("GROWLM_GPUS", "")
    run_snakemake(seq, *targets, "--cores", "1", "--configfile", str(TINY), "four.yaml")
    # four fake GPUs: four members at once, M_0 on two
    wd = fresh_copy(tiny_run, tmp_path / "four_gpus")
    monkeypatch.setenv("GROWLM_GPUS", "0,1,2,3")
    monkeypatch.setenv("GROWLM_GPU_LOCKS", str(tmp_path / "locks"))
    proc = run_snakemake(wd, *targets, "--cores", "4", "--set-resources", "train_baseline:gpu=2",
                         "--configfile", str(TINY), "four.yaml")
    output = proc.stdout + proc.stderr
    assert re.search(r"Provided resources: .*gpu=\D*4", output), output[-3000:]  # counted by the Snakefile

    where = {}
    for folder in [*MEMBERS, BASELINE]:
        meta = json.loads((wd / folder / "growlm.json").read_text())
        (rank,) = meta["where"]["ranks"]
        where[folder] = rank["visible_devices"]
    members = [where[m] for m in MEMBERS]
    assert sorted(members) == ["0", "1", "2", "3"], where  # a device each
    assert len(where[BASELINE].split(",")) == 2, where

    jobs = intervals(output)
    small = {f"results/tiny/models/small/d16_L1/s0/m{j['wildcards']['member']}": j for j in jobs
             if j["rule"] == "train_small"}
    (base,) = [j for j in jobs if j["rule"] == "train_baseline"]
    assert sorted(small) == MEMBERS, jobs
    assert max(j["start"] for j in small.values()) < min(j["end"] for j in small.values()), jobs  # all four at once
    # M_0's devices: none held by a member still running when M_0 claimed them. Snakemake's own "[date]" lines
    # cannot tell (it reports a job finished some time after its process, which held the devices, ended), so
    # the jobs' logs do: a member that logged a line in a later second than M_0's first was running then
    log = (wd / "results/tiny/logs/train_baseline/d32_L2_t24000_lr0.003_s0.log").read_text()
    assert f"GPUs {where[BASELINE]} of 0,1,2,3 claimed for this job" in log
    claimed = log_seconds(log)[0]  # M_0 claimed its devices before its first timed line
    running = {where[m] for m in MEMBERS
               if log_seconds((wd / f"results/tiny/logs/train_small/d16_L1_s0_m{m[-1]}.log").read_text())[-1] > claimed}
    assert not set(where[BASELINE].split(",")) & running, (where, running)

    for folder in [*MEMBERS, BASELINE]:  # the numbers of the run one job at a time
        assert ledger(wd / folder) == ledger(seq / folder), folder
        assert (wd / folder / "model.safetensors").read_bytes() == (seq / folder / "model.safetensors").read_bytes()
