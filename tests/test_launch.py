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
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY, alive, run_snakemake
from growlm import gpus, launch, processes
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


@pytest.mark.parametrize("argv, executor", [
    (["snakemake", "-n", "--cores", "1"], "local"),
    (["/venv/lib/python3.11/site-packages/snakemake/__main__.py", "-n", "--executor", "slurm"], "slurm"),
    (["snakemake", "-n", "--profile", "profiles/slurm"], "slurm"),  # the profile's executor, as the run applies it
    (["pytest", "-x", "tests"], None),  # another program running Snakemake through its Python API
])
def test_the_executor_is_read_from_snakemakes_own_command_line(argv, executor, monkeypatch):
    """While the Snakefile is read Snakemake has chosen no executor yet: growlm reads it from the command line
    with Snakemake's own parser (its profiles applied), not from Snakemake's stack frames."""
    monkeypatch.chdir(REPO)  # the run's working folder, where its profiles are found
    assert launch.snakemake_executor(None, argv) == executor


def test_the_executor_snakemake_runs_the_jobs_with_comes_first_and_a_dry_runs_stand_in_does_not():
    from types import SimpleNamespace

    def workflow(name):
        return SimpleNamespace(executor_plugin=SimpleNamespace(name=name))

    assert launch.snakemake_executor(workflow("slurm"), ["pytest"]) == "slurm"
    assert launch.snakemake_executor(workflow("dryrun"), ["pytest"]) is None  # -n names no executor of its own
    assert launch.snakemake_executor(SimpleNamespace(executor_plugin=None), ["pytest"]) is None


def test_a_plan_through_snakemakes_api_checks_this_machines_gpus_as_the_command_line_does(workflow_dir, monkeypatch):
    """plan() runs the Snakefile through Snakemake's Python API with the command line it plans for: the local
    executor's check of the machine's GPUs (and its GPU count) runs there too, as in `snakemake -n`
    (tests/test_gpus.py runs that command); it was skipped when the executor came from the stack."""
    from conftest import plan

    monkeypatch.setenv(gpus.POOL_ENV, "0,0")
    error, _ = plan(workflow_dir, configfiles=(TINY,))
    assert error is not None and "config error: GROWLM_GPUS=0,0 names GPU 0 more than once" in error, error


@pytest.mark.parametrize("how", [["-n"], ["--touch"], ["-n", "--executor", "local"]])
def test_the_command_lines_local_executor_is_known_while_the_snakefile_is_read(workflow_dir, monkeypatch, how):
    """`snakemake -n`, `snakemake --touch` (Snakemake's stand-in executors) and an explicit local executor: the
    Snakefile knows the local executor and checks the machine's GPUs before any job."""
    monkeypatch.setenv(gpus.POOL_ENV, "0,0")
    proc = run_snakemake(workflow_dir, *how, "--cores", "1", "--configfile", str(TINY), check=False)
    assert proc.returncode != 0
    assert "config error: GROWLM_GPUS=0,0 names GPU 0 more than once" in proc.stdout + proc.stderr, proc.stdout[-2000:]


def test_a_job_across_nodes_runs_in_an_allocation_of_as_many_nodes(monkeypatch):
    """runner.run_job asks growlm.launch for its allocation before any work: none on one node, and one line
    when SLURM gave the job other nodes than its resources say."""
    assert launch.job_allocation(1) is None
    alloc = launch.Allocation("42", ["n1", "n2"], ["10.0.0.1", "10.0.0.2"])
    monkeypatch.setattr(launch, "slurm_allocation", lambda: alloc)
    assert launch.job_allocation(2) is alloc
    with pytest.raises(GrowlmError, match=r"resources.nodes = 3, but SLURM job 42 has 2 node\(s\) \(n1, n2\)"):
        launch.job_allocation(3)


def test_a_world_of_one_meets_on_loopback_at_a_port_free_now():
    import socket

    alone = launch.world_of_one()
    assert {k: v for k, v in alone.items() if k != "MASTER_PORT"} == {
        "MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    with socket.socket() as s:  # free: this process can bind it
        s.bind(("127.0.0.1", int(alone["MASTER_PORT"])))


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


ONE_PROCESS = ("profile", "evaluate_model", "evaluate_ensemble", "evaluate_tasks")  # rules whose job is one process


@pytest.mark.parametrize("resources", ["{gpu: 0}", "{gpu: 2}", "{gpu: 2, gpu_share: 0.5}"])
def test_the_devices_a_rule_claims_are_the_ones_its_job_runs_processes_on(tmp_path, resources):
    """The tiny experiment planned in this process with the training jobs asking for 0 or 2 GPUs: every
    training job starts as many processes on its node as its rule claims GPUs (params.how, which its script
    passes to the runner, against resources.gpu); a job that runs one process (evaluation, profiling, a grow
    job) claims at most one GPU, and only when the training jobs ask for any; the rest claim none.
    growlm.launch says both sides."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, Quietness, ResourceSettings

    from conftest import copy_workflow

    wd = copy_workflow(tmp_path / "wf")
    (wd / "res.yaml").write_text(f"resources: {resources}\n")
    asked = int(re.search(r"gpu: (\d)", resources).group(1))
    with pytest.MonkeyPatch.context() as mp:  # what the Snakefile exports for its jobs is undone after
        for name in ("GROWLM_PARENT_PID", gpus.PLACED_ENV, gpus.SLOTS_ENV, "CUDA_DEVICE_ORDER", "PYTHONPATH",
                     "GROWLM_LIBRARY"):
            mp.setenv(name, "")
            mp.delenv(name)
        mp.setenv(gpus.POOL_ENV, "")  # the planning machine has no GPU: nothing is counted from it
        with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
            wf = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=ConfigSettings(
                configfiles=[wd / "config" / "config.yaml", TINY, wd / "res.yaml"]),
                snakefile=wd / "workflow" / "Snakefile", workdir=wd)
            wf.dag(DAGSettings(targets={"all"})).execute_workflow(executor="dryrun")
            jobs = list(wf._workflow.dag.jobs)
    seen = set()
    for job in jobs:
        claims = int(getattr(job.resources, "gpu", 0) or 0)
        how = getattr(job.params, "how", None)
        if isinstance(how, dict) and "gpus" in how:
            assert how["gpus"] == claims == asked and how["nodes"] == 1, (job.rule.name, how, claims)
            seen.add("training")
        elif job.rule.name in ONE_PROCESS or (job.rule.name == "grow" and claims):  # grow: a schedule
            assert claims == min(1, asked), (job.rule.name, claims)
            seen.add(job.rule.name)
        else:
            assert claims == 0, (job.rule.name, claims)
    assert {"training", "profile", "evaluate_model"} <= seen, seen


def test_a_rule_whose_gpu_and_gres_disagree_on_one_node_is_refused():
    """`--set-resources train_small:gres=gpu:2` beside the config's gpu 1: the job would claim one device and
    start two processes. Said before the first job, as every resource problem."""
    problems = launch.resource_problems({"train_small": {"gpu": 1, "gres": "gpu:2", "nodes": 1},
                                         "refine": {"gpu": 2, "gres": "gpu:2"}}, "local")
    assert problems == ["rule train_small: resources gpu=1 and gres='gpu:2' disagree on one node: give one of them"]
    with pytest.raises(GrowlmError, match="disagree"):
        launch.job_launch({"gpu": 1, "gres": "gpu:2"})
    assert launch.job_launch({"nodes": 2, "gres": "gpu:4", "cpus_per_task": 8}) == {"gpus": 4, "nodes": 2,
                                                                                   "cpus_per_task": 8}


# Snakemake runs a job's script as `bash -c "set -euo pipefail; python ..."`; bash before 5.1 does not exec that
# last command, so the job's parent is a shell that outlives Snakemake. `; true` keeps any bash from exec'ing.
RUN = r"""
import os, subprocess, sys
os.environ["GROWLM_PARENT_PID"] = str(os.getpid())  # what the Snakefile of a local run tells its jobs
shell = subprocess.Popen(["bash", "-c", 'set -e; "$0" -c "$1" "$2" "$3"; true', sys.executable, *sys.argv[1:]])
print(shell.pid, flush=True)
sys.exit(shell.wait())
"""

TRAINING_JOB = r"""
import json, sys
from growlm.errors import job_log
from growlm.launch import job_devices
from growlm.jobs.train import train_model
with job_log(sys.argv[2], "train_small"), job_devices({"gpu": 1}, "train_small"):
    train_model(**json.loads(sys.argv[1]))
"""


def _training_kw(tmp_path: Path, steps: int) -> dict:
    import numpy as np

    from growlm.tokenizer import fit_tokenizer
    from growlm.train_config import TrainConfig

    text = tmp_path / "train.txt"
    text.write_text("\n".join(["the cat sat on the mat", "see the dog run", "a red hen"] * 50))
    fit_tokenizer([text], tmp_path / "tok", vocab_size=300)
    np.save(tmp_path / "t.npy", np.random.default_rng(0).integers(0, 256, 20000).astype(np.uint16))
    train = TrainConfig(tokens=8 * 16 * steps, batch_size=8, context=16, lr=1e-3, warmup_steps=1, eval_interval=20,
                        eval_tokens=256, checkpoint_every=50, dense_log_steps=0, seed=1).run_settings()
    return dict(train=train, model={"n_embd": 16, "n_layer": 1, "n_positions": 16, "head_dim": 8,
                                    "tie_word_embeddings": True},
                init_seed=1, role="test", train_file=str(tmp_path / "t.npy"), val_file=str(tmp_path / "t.npy"),
                tokenizer_dir=str(tmp_path / "tok"), out_dir=str(tmp_path / "model"), gpus=1)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self").exists() or not shutil.which("bash"), reason="needs Linux's /proc, bash")
def test_kill_9_of_the_run_stops_its_job_under_a_shell_that_does_not_exec_it(tmp_path):
    """The run (standing in for Snakemake) starts a training job through a shell that stays its parent, as bash
    4.4 and 5.0 do, and is killed with SIGKILL mid-training: the shell lives on, the job does not - it gets
    SIGTERM from its watch of the run, writes a checkpoint, ends and frees its device at once; the next run of
    the job resumes from that checkpoint and finishes."""
    kw, log = _training_kw(tmp_path, steps=600), tmp_path / "job.log"
    env = {**os.environ, gpus.POOL_ENV: "0", gpus.LOCKS_ENV: str(tmp_path / "locks"), gpus.SLOTS_ENV: "1",
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO / "workflow" / "scripts")}
    env.pop("GROWLM_PARENT_PID", None)
    run = subprocess.Popen([sys.executable, "-c", RUN, TRAINING_JOB, json.dumps(kw), str(log)], env=env,
                           stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    shell = int(run.stdout.readline())
    job = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not re.search(r"\] step (?:[6-9]\d|\d{3,})/",
                                                            log.read_text() if log.is_file() else ""):
            time.sleep(0.1)
        (job,) = [int(p.name) for p in Path("/proc").glob("[0-9]*") if alive(int(p.name)) and
                  _parent(int(p.name)) == shell]
        assert alive(job), log.read_text()[-2000:]
        os.kill(run.pid, signal.SIGKILL)  # the run alone, as `kill -9 <pid>` of Snakemake
        run.wait()
        assert alive(shell), "the shell was to outlive the run, as bash before 5.1 does"
        deadline = time.monotonic() + 30
        while alive(job) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(job), "the training job ran on after its run was killed"
        text = log.read_text()
        assert re.search(r"SIGTERM after step \d+/600: checkpoint written", text), text[-2000:]
        got = subprocess.run([sys.executable, "-c", "from growlm.gpus import claim\n"
                              "claim(1, who='next job', log=lambda line: None, say_every_s=1)\nprint('GOT')"],
                             env=env, capture_output=True, text=True, timeout=10)
        assert "GOT" in got.stdout, "the device was still held after the job had ended"
    finally:
        for pid in (run.pid, shell, job):
            if pid:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        run.wait()
    again = subprocess.run([sys.executable, "-c", RUN, TRAINING_JOB, json.dumps(kw), str(log)], env=env,
                           capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, log.read_text()[-3000:]
    assert re.search(r"resumed from checkpoint step_\d+", log.read_text()), log.read_text()[-2000:]
    assert (tmp_path / "model" / "model.safetensors").is_file()


STARTS_SLEEP = r"""
import threading, time
from growlm import processes
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()  # a job has threads (its run's watch)
proc = processes.start(["sleep", "600"])
print(proc.pid, flush=True)
proc.wait()
"""


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_a_program_the_job_started_ends_with_the_job_whatever_it_is(tmp_path):
    """A process the job started (here `sleep`, which can watch nothing itself) asked for SIGTERM at the job's
    death before it exec'd its program: kill -9 of the job ends it at once."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow" / "scripts")}
    env.pop("GROWLM_PARENT_PID", None)
    job = subprocess.Popen([sys.executable, "-c", STARTS_SLEEP], env=env, stdout=subprocess.PIPE, text=True)
    child = int(job.stdout.readline())
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}/comm").read_text().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.02)  # the exec wrapper has set the signal and exec'd the program
        assert alive(child) and Path(f"/proc/{child}/comm").read_text().strip() == "sleep"
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the program ran on after the job was killed"
    finally:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)


def test_a_program_that_is_not_there_is_an_oserror_of_the_start():
    """What Popen would raise (a profiler's tool missing is an answer, not a crash: growlm.profiling.tools)."""
    with pytest.raises(FileNotFoundError, match="no-such-growlm-program"):
        processes.start(["no-such-growlm-program", "--version"])
