"""How a job gets its devices and processes (growlm.launch): read from its resources, checked before the first
job, and every process it starts ends with it and holds its devices until then.

What a job asks for: `gres` in SLURM's forms (gpu, gpu:N, gpu:TYPE, gpu:TYPE:N), `nodes` a whole number of at
least 1 and above 1 only through SLURM - checked for every rule, `--set-resources` included, while the
Snakefile is read (a dry run stops too). What a local run tells its jobs: growlm places their GPUs (inside a
SLURM allocation too), CUDA's device order is nvidia-smi's, and the Snakemake process whose death stops them.
A profiler the job started (a fake one here, which starts its workload in a session of its own as a
profiler's launcher may): a SIGTERM to the job (what its Snakemake's death sends) goes on to it, and no other
job gets the device before the workload has ended.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY, alive, run_snakemake
from growlm import gpus, launch
from growlm.errors import GrowlmError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("gres, per_node", [("gpu", 1), ("gpu:4", 4), ("gpu:a100", 1), ("gpu:a100:2", 2),
                                            ('"gpu:h100:8"', 8)])
def test_gres_is_read_in_slurms_forms(gres, per_node):
    assert launch.gpus_per_node({"gres": gres, "gpu": 0}) == per_node


@pytest.mark.parametrize("gres", ["gpu:a100:x", "tpu:4", "gpu::2", "gpu:a:b:4"])
def test_a_gres_growlm_cannot_read_is_one_line(gres):
    with pytest.raises(GrowlmError, match="gres"):
        launch.gpus_per_node({"gres": gres})


def test_a_gpu_job_is_refused_where_a_driver_is_present_and_torch_has_no_cuda(tmp_path, monkeypatch):
    """A venv built on a GPU-less login node has the CPU build of torch; on a compute node with a driver its
    jobs would claim GPUs and train on the CPU. A job that asks for GPUs (`gpu`, or `gres` across nodes) is
    refused in one line naming the fix, before it claims a device; without a driver it runs on the CPU as
    before (fake devices). torch is judged by what it reports (torch.version.cuda)."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)  # the suite's torch as the CPU build, wherever it runs
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho '| NVIDIA-SMI 570.00   Driver Version: 570.00   "
                                        "CUDA Version: 12.8 |'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv(gpus.POOL_ENV, "0,1")
    monkeypatch.setenv(gpus.LOCKS_ENV, str(tmp_path / "locks"))
    for name in (gpus.PLACED_ENV, "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(GrowlmError) as err, launch.job_devices({"gpu": 1}, "train_small"):
        pass
    line = str(err.value)
    assert line.startswith(f"rule train_small: asks for 1 GPU and this machine has an NVIDIA driver (nvidia-smi: "
                           f"CUDA 12.8), but torch {torch.__version__} has no CUDA (torch.version.cuda is None): "
                           "it would train on the CPU. Install the CUDA build here with `bash setup.sh`"), line
    assert "\n" not in line and "gpu: 0" in line
    assert not list((tmp_path / "locks").glob("*.lock")) and "CUDA_VISIBLE_DEVICES" not in os.environ  # no claim
    with pytest.raises(GrowlmError, match="asks for 4 GPUs and this machine has an NVIDIA driver"), \
            launch.job_devices({"gres": "gpu:a100:4", "nodes": 2}, "refine"):
        pass
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    if launch.nvidia_driver():  # a real driver here: the job would be refused, rightly
        return
    with launch.job_devices({"gpu": 1}, "train_small") as claimed:  # no driver: the CPU trains, as before
        assert claimed.devices == ["0"]


def test_every_rules_resources_are_checked():
    rules = {"train_baseline": {"nodes": 2, "gpu": 1}, "refine": {"nodes": 0}, "grow": {"gpu": -1},
             "train_small": {"gres": "gpu:a100:x", "nodes": 1}, "evaluate_model": {"gpu": 1, "mem_mb": lambda: 1},
             "profile": {"nodes": "two"}}
    problems = launch.resource_problems(rules, "local")
    assert problems == [
        "rule grow: resources gpu=-1: a whole number of at least 0",
        "rule profile: resources nodes='two': a whole number of at least 1",
        "rule refine: resources nodes=0: a whole number of at least 1",
        "rule train_baseline: resources nodes=2: a job across several nodes runs through SLURM (--profile "
        "profiles/slurm), and this run uses Snakemake's local executor",
        "rule train_small: resources gres 'gpu:a100:x': the count after the type must be a number (gpu:TYPE:COUNT)",
    ]
    assert launch.resource_problems({"train_baseline": {"nodes": 2}}, "slurm") == []


@pytest.mark.parametrize("setting, said", [("train_baseline:nodes=2", "rule train_baseline: resources nodes=2: a job "
                                            "across several nodes runs through SLURM"),
                                           ("train_baseline:nodes=0", "rule train_baseline: resources nodes=0")])
def test_set_resources_outside_slurm_stop_the_dry_run(workflow_dir, setting, said):
    """Snakemake takes `--set-resources train_baseline:nodes=2` on a local run; the job would fail (or run on
    one node) hours later. The dry run says so instead."""
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(TINY), "--set-resources", setting,
                         check=False)
    assert proc.returncode != 0 and f"resources error: {said}" in proc.stdout + proc.stderr, proc.stderr[-2000:]


def test_a_local_run_tells_its_jobs_who_places_their_gpus_and_whose_death_stops_them():
    local = launch.run_environment("local", True)
    assert local == {gpus.PLACED_ENV: "growlm", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                     "GROWLM_PARENT_PID": str(os.getpid())}
    submitted = launch.run_environment("slurm", True)  # the jobs of a SLURM run: SLURM placed each one's GPUs
    assert submitted[gpus.PLACED_ENV] == "scheduler" and submitted["GROWLM_PARENT_PID"] is None
    assert launch.run_environment("slurm-jobstep", False)[gpus.PLACED_ENV] == "scheduler"
    assert "GROWLM_PARENT_PID" not in launch.run_environment("local", False)  # a job step of a local run
    with pytest.MonkeyPatch.context() as mp:  # the rule of a SLURM job runs under a local Snakemake of its own
        mp.setenv(gpus.PLACED_ENV, "scheduler")
        assert gpus.PLACED_ENV not in launch.run_environment("local", False)
        assert launch.run_environment("local", True)[gpus.PLACED_ENV] == "growlm"  # the user's run decides


PROFILER = """#!/bin/sh
setsid "$@" &
echo $! > "$WORKLOAD_PID"
wait
"""

# a workload as growlm's is: SIGTERM when its parent dies, a few seconds to write what it must, then it ends
WORKLOAD = """
import ctypes, signal, sys, time
ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(3), sys.exit(0)))
time.sleep(600)
"""

PROFILE_JOB = r"""
import sys
from growlm.gpus import claim
from growlm.profiling.tools import run_command
claim(1, who="profile job", log=lambda line: None)
print("GOT", flush=True)
print("RC", run_command([sys.argv[1], sys.executable, "-c", sys.argv[2]], timeout=600)[0], flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_a_profiling_job_stopped_by_sigterm_keeps_its_device_until_its_workload_has_ended(tmp_path):
    profiler = tmp_path / "profiler"
    profiler.write_text(PROFILER)
    profiler.chmod(0o755)
    env = {**os.environ, gpus.POOL_ENV: "0", gpus.LOCKS_ENV: str(tmp_path / "locks"), gpus.SLOTS_ENV: "1",
           "WORKLOAD_PID": str(tmp_path / "workload.pid"), "PYTHONPATH": str(REPO / "workflow" / "scripts")}
    env.pop("GROWLM_PARENT_PID", None)
    job = subprocess.Popen([sys.executable, "-c", PROFILE_JOB, str(profiler), WORKLOAD], env=env,
                           stdout=subprocess.PIPE, text=True)
    workload = None
    try:
        assert job.stdout.readline().startswith("GOT")
        deadline = time.monotonic() + 60
        while workload is None and time.monotonic() < deadline:
            text = (tmp_path / "workload.pid").read_text().strip() if (tmp_path / "workload.pid").is_file() else ""
            workload = int(text) if text else None
            time.sleep(0.1)
        assert workload and alive(workload)
        time.sleep(1)  # the workload is under way
        job.send_signal(signal.SIGTERM)  # what the job gets when its Snakemake dies
        other = subprocess.Popen([sys.executable, "-c", "from growlm.gpus import claim\n"
                                  "claim(1, who='next job', log=lambda line: None)\nprint('GOT', flush=True)"],
                                 env=env, stdout=subprocess.PIPE, text=True)
        assert other.stdout.readline().startswith("GOT")
        assert not alive(workload), "the next job got the device while the profiled workload still ran"
        other.wait(timeout=30)
        assert job.wait(timeout=30) != 0
    finally:
        for pid in [job.pid, workload]:
            if pid:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        job.wait()


def test_one_module_says_how_a_job_gets_its_devices_and_processes():
    """The entry scripts, the job functions, the runner and the error boundary ask growlm.launch: none reads the
    `gpu` resource itself, claims GPUs, picks a free port or builds a torchrun command but it (and the agent it
    starts, growlm.node_agent)."""
    scripts = REPO / "workflow" / "scripts"
    library = scripts / "growlm"
    for path in sorted(scripts.glob("*.py")):
        text = path.read_text()
        assert "sm.resources" not in text.replace("job_devices(sm.resources, sm.rule)", ""), path.name
    for path in sorted(library.rglob("*.py")):
        text, name = path.read_text(), path.relative_to(library).as_posix()
        if name not in ("launch.py", "gpus.py"):
            assert ".claim(" not in text and "import claim" not in text, name
        if name != "launch.py":
            assert "def free_port" not in text and "def _free_port" not in text, name
            assert "def processes_for" not in text or name == "prepare.py", name  # prepare's: corpus processes
        if name not in ("launch.py", "node_agent.py"):
            assert '"torch.distributed.run"' not in text and "srun" not in re.sub(r"#.*|\"\"\"[\s\S]*?\"\"\"", "",
                                                                                    text), name
