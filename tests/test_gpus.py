"""Jobs of a local run share a machine's GPUs: each claims devices of its own (growlm.gpus).

On a fake machine of four devices (GROWLM_GPUS=0,1,2,3, the locks in the test's own folder): jobs
started together get different devices, a job that needs more than are free waits until they are, a
killed job's devices are free again at once, a job's torchrun processes keep its devices until the last
of them ends, k jobs share a device when each plans for 1/k of it, and inside a SLURM job nothing is
claimed (SLURM placed the GPUs). The workflow run on the fake machine is in tests/test_workflow_gpus.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from growlm import gpus

REPO = Path(__file__).resolve().parents[1]

# a job: claims N devices, says which, and holds them until it is killed (or SPAWN: a child holds them too)
JOB = r"""
import os, subprocess, sys, time
from growlm.gpus import claim, held_fds
c = claim(int(sys.argv[1]), who="test job", log=lambda line: print("LOG", line, flush=True), say_every_s=0.5)
print("GOT", os.environ.get("CUDA_VISIBLE_DEVICES", ""), flush=True)
if sys.argv[2:] == ["spawn"]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], pass_fds=held_fds())
    print("CHILD", child.pid, flush=True)
time.sleep(600)
"""


@pytest.fixture
def machine(tmp_path, monkeypatch):
    env = {gpus.POOL_ENV: "0,1,2,3", gpus.LOCKS_ENV: str(tmp_path / "locks"), gpus.SLOTS_ENV: "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    procs: list[subprocess.Popen] = []

    def start(count: int, *extra: str, slots: int = 1) -> subprocess.Popen:
        full = {**os.environ, **env, gpus.SLOTS_ENV: str(slots), "PYTHONPATH": str(REPO / "workflow" / "scripts")}
        p = subprocess.Popen([sys.executable, "-c", JOB, str(count), *extra], stdout=subprocess.PIPE, text=True,
                             env=full)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def line(proc: subprocess.Popen, prefix: str, timeout: float = 30) -> str:
    """The first line of `proc`'s output that starts with `prefix`, without it."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = proc.stdout.readline()
        if text.startswith(prefix):
            return text[len(prefix):].strip()
        if not text and proc.poll() is not None:
            break
    raise AssertionError(f"no {prefix!r} line from the job in {timeout} s")


def test_the_machine_devices_come_from_growlm_gpus_then_cuda_visible_devices():
    assert gpus.machine_gpus({"GROWLM_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0"}) == ["2", "3"]
    assert gpus.machine_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}) == ["GPU-a1", "GPU-b2"]
    assert gpus.machine_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpus.slots_per_gpu(1.0) == 1 and gpus.slots_per_gpu(0.5) == 2 and gpus.slots_per_gpu(1 / 3) == 3


def test_four_jobs_started_together_get_four_devices_and_a_two_gpu_job_waits_for_two_free_ones(machine):
    jobs = [machine(1) for _ in range(4)]
    got = [line(j, "GOT") for j in jobs]
    assert sorted(got) == ["0", "1", "2", "3"], got
    big = machine(2)  # the machine is full: it waits, saying who holds the devices
    waiting = line(big, "LOG")
    assert waiting.startswith("waiting for 2 free GPUs of 0,1,2,3"), waiting
    assert "test job" in waiting, waiting  # who holds them
    killed = [jobs[got.index("1")], jobs[got.index("3")]]
    for j in killed:
        j.send_signal(signal.SIGKILL)  # killed: the kernel releases its lock at once
        j.wait()
    assert line(big, "GOT") == "1,3"  # exactly the devices no running job holds


def test_a_jobs_devices_stay_claimed_until_its_last_process_ends(machine):
    parent = machine(4, "spawn")
    assert line(parent, "GOT") == "0,1,2,3"
    child = int(line(parent, "CHILD"))
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    late = machine(1)
    first = line(late, "LOG")  # the child still holds the open lock files: no device is free
    assert first.startswith("waiting for 1 free GPU"), first
    os.kill(child, signal.SIGKILL)
    assert line(late, "GOT") in {"0", "1", "2", "3"}


def test_k_jobs_share_a_device_when_each_plans_for_one_kth(machine, monkeypatch):
    jobs = [machine(1, slots=2) for _ in range(8)]
    got = sorted(line(j, "GOT") for j in jobs)
    assert got == ["0", "0", "1", "1", "2", "2", "3", "3"], got


def test_inside_slurm_or_without_gpus_nothing_is_claimed(machine, monkeypatch, tmp_path):
    said = []
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    claim = gpus.claim(2, log=said.append)
    assert claim.placed_by == "slurm" and claim.devices == ["0"] and not claim.fds
    assert not (tmp_path / "locks").exists()  # no lock taken
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv(gpus.POOL_ENV, "")
    claim = gpus.claim(1, log=said.append)
    assert claim.placed_by == "none" and said[-1].endswith("this machine has none: the job runs on the CPU")
    assert gpus.claim(0, log=said.append).devices == []
