"""Jobs of a local run share a machine's GPUs: each claims devices of its own (growlm.gpus).

On a fake machine of four devices (GROWLM_GPUS=0,1,2,3, the locks in the test's own folder): jobs
started together get different devices, a job that needs more than are free waits until they are, a
killed job's devices are free again at once, a job's torchrun processes keep its devices until the last
of them ends, k jobs share a device when each plans for 1/k of it and take free devices before a second
slot of a busy one, jobs of a local run inside a SLURM allocation claim as anywhere else, and a job a
cluster executor submitted claims nothing (the scheduler placed its GPUs). Locks are named by the
device's UUID where nvidia-smi gives one (a fake nvidia-smi here), are readable by every user whatever
the umask, and a device list with an id twice or a non-id is refused. The workflow run on the fake
machine is in tests/test_workflow_gpus.py.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import TINY, plan, run_snakemake
from growlm import gpus
from growlm.errors import GrowlmError

REPO = Path(__file__).resolve().parents[1]

# a job: claims N devices, says which, and holds them until it is killed (or SPAWN: a child holds them too)
JOB = r"""
import os, subprocess, sys, time
from growlm.gpus import claim, held_fds
c = claim(int(sys.argv[1]), who="test job", log=lambda line: print("LOG", line, flush=True), say_every_s=0.5)
print("GOT", os.environ.get("CUDA_VISIBLE_DEVICES", ""), flush=True)
print("ORDER", os.environ.get("CUDA_DEVICE_ORDER", ""), flush=True)
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

    def start(count: int, *extra: str, slots: int = 1, environ: dict | None = None, umask: int | None = None
              ) -> subprocess.Popen:
        full = {**os.environ, **env, gpus.SLOTS_ENV: str(slots), "PYTHONPATH": str(REPO / "workflow" / "scripts"),
                **(environ or {})}
        p = subprocess.Popen([sys.executable, "-c", JOB, str(count), *extra], stdout=subprocess.PIPE, text=True,
                             env=full, umask=-1 if umask is None else umask)
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


@pytest.mark.parametrize("share, slots", [(1, 1), (0.5, 2), (0.33, 3), (0.333, 3), (0.25, 4), (0.167, 6), (0.45, 2),
                                          (0.9, 1), (0.125, 8)])
def test_a_share_gives_as_many_jobs_per_gpu_as_fit_in_it(share, slots):
    assert gpus.slots_per_gpu(share) == slots and slots * share <= 1.005


@pytest.mark.parametrize("share, said", [(0.6, "2 jobs per GPU would plan for 120%"),
                                         (0.35, "3 jobs per GPU would plan for 105%"),
                                         (0.55, "2 jobs per GPU would plan for 110%"), (0.17, "6 jobs per GPU")])
def test_a_share_whose_jobs_would_over_commit_a_gpu_is_refused(share, said):
    """Rounded, 0.6 gave 2 jobs per GPU (120% of its memory) and 0.35 gave 3 (105%): refused, naming 1/k."""
    with pytest.raises(GrowlmError, match=re.escape(f"resources.gpu_share = {share}: {said}")):
        gpus.slots_per_gpu(share)


def test_the_config_check_refuses_a_share_that_does_not_divide_a_gpu(workflow_dir):
    error, jobs = plan(workflow_dir, "resources={gpu_share: 0.6}", configfiles=(TINY,))
    assert error and "resources.gpu_share = 0.6: 2 jobs per GPU would plan for 120% of its memory" in error, error
    assert not jobs


def test_claims_started_together_never_take_the_same_device_while_another_is_free(tmp_path, monkeypatch):
    """Four jobs sharing GPUs two to a device (gpu_share 0.5) start at the same instant on four free devices,
    fifteen times: each time every job gets a device of its own. Ranking the devices by how busy they are and
    taking a slot is one step under the machine's claim lock; without it two claims ranked the same free
    device first and both took a slot of it."""
    monkeypatch.setenv(gpus.POOL_ENV, "0,1,2,3")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(gpus.PLACED_ENV, raising=False)
    for round_ in range(15):
        monkeypatch.setenv(gpus.LOCKS_ENV, str(tmp_path / f"locks{round_}"))
        start, got = threading.Barrier(4), []

        def job():
            start.wait()
            got.append(gpus.claim(1, slots=2, log=lambda line: None))

        threads = [threading.Thread(target=job) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        devices = sorted(c.devices[0] for c in got)
        for c in got:
            c.release()
        assert devices == ["0", "1", "2", "3"], f"round {round_}: {devices}"


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


def test_shared_jobs_take_a_free_device_before_a_second_slot_of_a_busy_one(machine):
    """gpu_share 0.5: two jobs on four free devices get two devices, not both halves of the first."""
    first = machine(1, slots=2)
    assert line(first, "GOT") == "0"
    second = machine(1, slots=2)
    assert line(second, "GOT") == "1"


def test_a_local_run_inside_a_slurm_allocation_gives_each_job_devices_of_its_own(machine):
    """`salloc --gres=gpu:4`, then a local run in it: SLURM placed the run, not each job."""
    inside = {"SLURM_JOB_ID": "99", gpus.PLACED_ENV: "growlm"}
    jobs = [machine(1, environ=inside) for _ in range(3)]
    got = [line(j, "GOT") for j in jobs]
    assert len(set(got)) == 3 and set(got) <= {"0", "1", "2", "3"}, got
    bare = machine(1, environ={"SLURM_JOB_ID": "99"})  # a job started without the Snakefile's word claims too
    assert line(bare, "GOT") not in got


def test_a_job_the_scheduler_placed_or_without_gpus_claims_nothing(machine, monkeypatch, tmp_path):
    said = []
    monkeypatch.setenv(gpus.PLACED_ENV, "scheduler")  # the SLURM executor submitted this job
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    claim = gpus.claim(2, log=said.append)
    assert claim.placed_by == "scheduler" and claim.devices == ["0"] and not claim.fds
    assert not (tmp_path / "locks").exists()  # no lock taken
    monkeypatch.delenv(gpus.PLACED_ENV)
    monkeypatch.setenv(gpus.POOL_ENV, "")
    claim = gpus.claim(1, log=said.append)
    assert claim.placed_by == "none" and said[-1].endswith("this machine has none: the job runs on the CPU")
    assert gpus.claim(0, log=said.append).devices == []


def fake_nvidia_smi(folder: Path, uuids: list[str]) -> str:
    """A folder with an `nvidia-smi` that lists `uuids` as devices 0, 1, ... (index, uuid), for PATH."""
    folder.mkdir(parents=True)
    rows = "\n".join(f"{i}, {u}" for i, u in enumerate(uuids))
    (folder / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s\\n' '{rows}'\n")
    (folder / "nvidia-smi").chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def test_locks_are_named_by_the_devices_uuid(machine, tmp_path):
    """Two allocations on one node, each with its own device renumbered as 0 and /tmp shared: both jobs get
    their device at once (a lock named "0" would have the second wait for the first)."""
    a = machine(1, environ={gpus.POOL_ENV: "0", "PATH": fake_nvidia_smi(tmp_path / "a", ["GPU-aaaa-1111"])})
    assert line(a, "GOT") == "0"
    b = machine(1, environ={gpus.POOL_ENV: "0", "PATH": fake_nvidia_smi(tmp_path / "b", ["GPU-bbbb-2222"])})
    assert line(b, "GOT") == "0"
    names = sorted(f.name for f in (tmp_path / "locks").glob("gpu-*.lock"))
    assert names == ["gpu-GPU-aaaa-1111.0.lock", "gpu-GPU-bbbb-2222.0.lock"], names


def test_lock_files_are_open_to_every_user_whatever_the_umask_and_jobs_see_pci_order(machine, tmp_path):
    job = machine(1, umask=0o077)
    assert line(job, "GOT") == "0"
    assert line(job, "ORDER") == "PCI_BUS_ID"  # the index nvidia-smi shows is the device the job gets
    (lock,) = (tmp_path / "locks").glob("gpu-*.lock")
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666  # another user's run can test it
    assert stat.S_IMODE((tmp_path / "locks" / "claim.lock").stat().st_mode) == 0o666  # and the claim lock


@pytest.mark.parametrize("pool, said", [("0,0", "names GPU 0 more than once"), ("a,b", "'a', 'b' is no GPU id"),
                                        ("0, 1,GPU-1f2e", None), ("1,MIG-4a/1/0", None)])
def test_a_device_list_with_an_id_twice_or_a_non_id_is_refused(pool, said):
    problem = gpus.pool_problem({"GROWLM_GPUS": pool})
    assert (problem is None) if said is None else (said in problem and problem.startswith(f"GROWLM_GPUS={pool}"))


def test_the_workflow_refuses_such_a_list_before_any_job(workflow_dir, monkeypatch):
    monkeypatch.setenv("GROWLM_GPUS", "0,0")
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(TINY), check=False)
    assert proc.returncode != 0
    assert "config error: GROWLM_GPUS=0,0 names GPU 0 more than once" in proc.stdout + proc.stderr, proc.stdout[-2000:]
