"""Integration tests on a real two-node SLURM cluster on localhost (tests/slurm_cluster.py).

The module fixture installs slurm-wlm + munge with apt-get if missing (root only), starts the
daemons and stops them afterwards; without root/apt/daemons every test is skipped with the
reason. A toy workflow (written into tmp folders) runs through `profiles/slurm-local` and checks:
  * the resources its rules declare reach the scheduler (seen by `scontrol show job` from inside
    the job, by the job's environment, and in the sbatch lines of `--verbose`);
  * the profile's time-limit warning (`slurm_extra: --signal=TERM@...`) reaches the training
    process inside the plugin's srun step; it checkpoints, and Snakemake's retry resumes;
  * `scancel` mid-run (SIGTERM to all steps, job CANCELLED): the retry resumes;
  * preemption by a higher-priority partition with `--slurm-requeue`: SLURM requeues the job
    itself (no Snakemake retry allowed) and it resumes.
Snakemake runs through tests/slurm_snakemake.py: the plugin's checks of its jobs' status come every 2 s instead
of backing off to minutes, which was most of these tests' wall time. What is left is mostly waiting: for
SLURM's time-limit warning (the toy's first attempt), for a requeued job to start again, for the jobs.

For the real workflow: `run_snakemake_on_cluster(workdir, snakefile, configfiles, extra_args)`
from slurm_cluster.py, with the `cluster` fixture below.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    from slurm_cluster import (
        ClusterUnavailable,
        popen_snakemake_on_cluster,
        run_snakemake_on_cluster,
        start_cluster,
        stop_cluster,
    )
except ImportError:  # tests/ imported as a package
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from slurm_cluster import (  # noqa: E402
        ClusterUnavailable,
        popen_snakemake_on_cluster,
        run_snakemake_on_cluster,
        start_cluster,
        stop_cluster,
    )

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def _cluster_conf(monkeypatch):
    """SLURM's commands in these tests (sbatch, squeue, scontrol) read the test cluster's own slurm.conf, not
    the controller-less one tests/conftest.py gives every other process (slurm_cluster.cluster_env)."""
    monkeypatch.delenv("SLURM_CONF", raising=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        info = start_cluster(tmp_path_factory.mktemp("slurm-cluster"))
    except ClusterUnavailable as e:
        print(f"\nlocal SLURM cluster unavailable: {e}")
        pytest.skip(f"local SLURM cluster unavailable: {e}")
    print(f"\nlocal SLURM cluster up in {info.setup_s:.1f} s ({info.host}, {info.cpus} CPUs, "
          f"{info.mem_mb} MB, started {sorted(info.started)}; installed: {info.installed})")
    yield info
    stop_cluster(info)


# ---------------------------------------------------------------------------------------------
# The toy workflow
# ---------------------------------------------------------------------------------------------

TOY_SNAKEFILE = r'''
rule all:
    input:
        "gpu/env.txt",
        "cpu/job.txt",
        "train/result.json",


rule cpu_step:
    output:
        job="cpu/job.txt",
        env="cpu/env.txt",
    threads: 2
    resources:
        mem_mb=300,
        runtime=3,
    shell:
        "scontrol show job $SLURM_JOB_ID > {output.job}; "
        "env | grep -E '^(SLURM_|CUDA_VISIBLE_DEVICES)' | sort > {output.env}"


rule gpu_step:
    output:
        env="gpu/env.txt",
        job="gpu/job.txt",
    resources:
        gpu=1,
        cpus_per_gpu=1,
        mem_mb=500,
        runtime=5,
    shell:
        "env | grep -E '^(SLURM_|CUDA_VISIBLE_DEVICES)' | sort > {output.env}; "
        "scontrol show job $SLURM_JOB_ID > {output.job}"


# resumable "training": checkpoint in ckpt/ (not a declared output, so Snakemake keeps it)
rule train:
    output:
        "train/result.json",
    params:
        steps=config.get("steps", 40),
        delay=config.get("delay", 0.2),
        hold=config.get("hold", 0),
    resources:
        mem_mb=300,
        runtime=lambda wc, attempt: config.get("train_runtime", 10) * attempt,
    shell:
        "python3 {workflow.basedir}/train_loop.py {output} ckpt/train.json {params.steps} {params.delay} {params.hold}"
'''

TOY_TRAIN_LOOP = r'''
"""Toy training loop: resumes from its checkpoint; on SIGTERM/SIGUSR1 saves one and exits 128+sig.

It checkpoints only when signalled, so a resumed step > 0 proves the signal reached it.
A first attempt (start 0) runs for at least `hold` seconds, waiting for a signal of unknown time."""
import json, os, signal, sys, time

out, ckpt, total, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
hold = float(sys.argv[5])
os.makedirs(os.path.dirname(ckpt), exist_ok=True)
start = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
job = os.environ.get("SLURM_JOB_ID", "?")


def log(msg):
    with open(ckpt + ".attempts", "a") as f:
        f.write(msg + "\n")


log(f"job={job} start={start}")
step = start
hold_until = time.monotonic() + hold if start == 0 else 0.0


def save(signum, frame):
    with open(ckpt + ".tmp", "w") as f:
        json.dump({"step": step, "signal": signal.Signals(signum).name, "job": job}, f)
    os.replace(ckpt + ".tmp", ckpt)
    log(f"job={job} got={signal.Signals(signum).name} step={step}")
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, save)
signal.signal(signal.SIGUSR1, save)
while step < total or time.monotonic() < hold_until:
    time.sleep(delay)
    step += 1
    with open(ckpt + ".progress", "w") as f:
        f.write(f"{job} {step}\n")
with open(out, "w") as f:
    json.dump({"steps": step, "resumed_from": start, "job": job}, f)
'''


def write_toy(workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "Snakefile").write_text(TOY_SNAKEFILE)
    (workdir / "train_loop.py").write_text(TOY_TRAIN_LOOP)
    return workdir / "Snakefile"


def tail(text: str, n: int = 60) -> str:
    return "\n".join(text.splitlines()[-n:])


def slurm_logs(workdir: Path) -> str:
    return "\n".join(
        f"--- {p}\n{tail(p.read_text(errors='replace'), 40)}"
        for p in sorted((workdir / ".snakemake" / "slurm_logs").rglob("*.log"))
    )


def scontrol_fields(text: str) -> dict[str, str]:
    """`scontrol show job` output as {key: value} (values without spaces)."""
    return dict(re.findall(r"(\w[\w/:]*)=(\S*)", text))


def attempts(workdir: Path) -> list[str]:
    p = workdir / "ckpt" / "train.json.attempts"
    return p.read_text().splitlines() if p.exists() else []


def wait_for_progress(workdir: Path, proc: subprocess.Popen, min_step: int, timeout: float = 90):
    """(slurm job id, step) once the toy loop has done `min_step` steps."""
    progress = workdir / "ckpt" / "train.json.progress"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(f"snakemake ended early (rc {proc.returncode})")
        if progress.exists():
            parts = progress.read_text().split()
            if len(parts) == 2 and int(parts[1]) >= min_step:
                return parts[0], int(parts[1])
        time.sleep(0.2)
    pytest.fail(f"the training job did not reach step {min_step} in {timeout} s")


def finish(proc: subprocess.Popen, log: Path, timeout: float = 300) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # snakemake cancels its SLURM jobs on SIGTERM
        proc.wait(timeout=60)
        pytest.fail(f"snakemake did not finish in {timeout} s:\n{tail(log.read_text())}")
    return log.read_text()


# ---------------------------------------------------------------------------------------------
# (a) the cluster itself
# ---------------------------------------------------------------------------------------------


def test_sbatch_gpu_job_sees_fake_gpu(cluster, tmp_path):
    out = tmp_path / "gpu.out"
    p = subprocess.run(
        ["sbatch", "--parsable", "--gpus=1", "-t", "1", "-o", str(out),
         "--wrap", "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"],
        capture_output=True, text=True, timeout=30,
    )
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    end = time.monotonic() + 30
    state = ""
    while time.monotonic() < end:
        state = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"],
                               capture_output=True, text=True).stdout.strip()
        if state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}:
            break
        time.sleep(0.3)
    assert state == "COMPLETED", f"job {job} state {state!r}"
    assert "CUDA_VISIBLE_DEVICES=0" in out.read_text()


# ---------------------------------------------------------------------------------------------
# (b) + (e) one run of the whole toy through profiles/slurm-local
# ---------------------------------------------------------------------------------------------

# Attempt 1 of `train` gets a 3-minute limit and TERM 110 s before it. SLURM sends such warnings
# up to ~60 s early, so it comes 10-70 s after the start (not earlier: a signal sent before the
# job step exists is lost), while the loop holds for up to 120 s; attempt 2 (6-minute limit)
# resumes and finishes in seconds. The profile's own TERM@120 is checked on the other rules.
FULL_RUN_ARGS = [
    "all", "--verbose",
    "--config", "steps=20", "delay=0.2", "hold=120", "train_runtime=3",
    "--set-resources", "train:slurm_extra='--signal=TERM@110'",
]


@pytest.fixture(scope="module")
def full_run(cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("toy-full")
    snakefile = write_toy(workdir)
    t0 = time.monotonic()
    proc = run_snakemake_on_cluster(workdir, snakefile, extra_args=FULL_RUN_ARGS, timeout=420)
    print(f"\ntoy workflow on SLURM: {time.monotonic() - t0:.0f} s")
    (workdir / "snakemake.out").write_text(proc.stdout)
    assert proc.returncode == 0, f"{tail(proc.stdout)}\n{slurm_logs(workdir)}"
    return workdir, proc.stdout


def sbatch_line(output: str, rule: str) -> str:
    lines = [l for l in output.splitlines() if l.startswith("sbatch call:") and f"rule_{rule}" in l]
    assert lines, f"no sbatch line for {rule} (was --verbose given?)"
    return lines[0]


def test_gpu_rule_gets_requested_resources(full_run):
    workdir, output = full_run
    line = sbatch_line(output, "gpu_step")
    for flag in ("-p debug", "-t 5", "--mem 500", "--gpus=1", "--cpus-per-gpu=1", "--requeue",
                 "--signal=TERM@120"):
        assert re.search(rf"(^|\s){re.escape(flag)}(\s|$)", line), f"{flag!r} not in: {line}"
    assert " -A " not in line  # no account on the test cluster

    job = scontrol_fields((workdir / "gpu" / "job.txt").read_text())  # the scheduler's view
    assert job["Partition"] == "debug"
    assert job["TimeLimit"] == "00:05:00"
    assert job["MinMemoryNode"] == "500M"
    assert job["NumCPUs"] == "1"
    assert job["TresPerJob"] in {"gres:gpu:1", "gres/gpu:1", "gpu:1"}, job["TresPerJob"]
    assert job["CpusPerTres"] in {"gres:gpu:1", "gres/gpu:1", "gpu:1"}, job["CpusPerTres"]
    assert job["Requeue"] == "1"

    env = dict(l.split("=", 1) for l in (workdir / "gpu" / "env.txt").read_text().splitlines())
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["SLURM_GPUS_ON_NODE"] == "1"
    assert env["SLURM_JOB_PARTITION"] == "debug"


def test_cpu_rule_gets_requested_resources(full_run):
    workdir, output = full_run
    line = sbatch_line(output, "cpu_step")
    for flag in ("-p debug", "-t 3", "--mem 300", "--cpus-per-task=2", "--ntasks=1"):
        assert re.search(rf"(^|\s){re.escape(flag)}(\s|$)", line), f"{flag!r} not in: {line}"
    assert "--gpus" not in line

    job = scontrol_fields((workdir / "cpu" / "job.txt").read_text())
    assert job["TimeLimit"] == "00:03:00"
    assert job["MinMemoryNode"] == "300M"
    assert job["NumCPUs"] == "2"
    assert job["CPUs/Task"] == "2"
    env = dict(l.split("=", 1) for l in (workdir / "cpu" / "env.txt").read_text().splitlines())
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_time_limit_warning_signal_then_retry_resumes(full_run):
    workdir, output = full_run
    lines = attempts(workdir)
    got = [l for l in lines if "got=SIGTERM" in l]
    assert got, f"the training process never got the --signal warning: {lines}"
    first_job = got[0].split()[0]
    result = json.loads((workdir / "train" / "result.json").read_text())
    assert result["resumed_from"] > 0, lines
    assert f"job={result['job']}" != first_job, "expected a resubmitted SLURM job (Snakemake retry)"
    lines = [l for l in output.splitlines() if l.startswith("sbatch call:") and "rule_train" in l]
    assert len(lines) == 2, lines
    assert "--signal=TERM@110" in lines[0] and " -t 3 " in lines[0], lines[0]
    assert " -t 6 " in lines[1], lines[1]  # runtime scaled by attempt


# ---------------------------------------------------------------------------------------------
# (c) scancel mid-run -> CANCELLED -> Snakemake retry (profile: retries: 1) resumes
# ---------------------------------------------------------------------------------------------


def test_scancel_then_retry_resumes_from_checkpoint(cluster, tmp_path):
    snakefile = write_toy(tmp_path)
    log = tmp_path / "snakemake.out"
    proc = popen_snakemake_on_cluster(
        tmp_path, snakefile, extra_args=["train", "--config", "steps=40"], log=log)
    job, step = wait_for_progress(tmp_path, proc, min_step=5)
    # plain scancel = what preemption without requeue and the time limit do: SIGCONT + SIGTERM
    # to every step and the batch shell, SIGKILL after KillWait
    subprocess.run(["scancel", job], check=True, timeout=30)
    output = finish(proc, log)
    assert proc.returncode == 0, f"{tail(output)}\n{slurm_logs(tmp_path)}"
    lines = attempts(tmp_path)
    assert any(l.startswith(f"job={job} got=SIGTERM") for l in lines), lines
    result = json.loads((tmp_path / "train" / "result.json").read_text())
    assert result["resumed_from"] >= step > 0, lines
    assert result["job"] != job  # a new SLURM job: Snakemake's retry
    assert "CANCELLED" in output or "Trying to restart" in output


# ---------------------------------------------------------------------------------------------
# (d) preemption by the `urgent` partition -> SLURM requeues (--slurm-requeue) -> resumes
# ---------------------------------------------------------------------------------------------


def test_preemption_requeue_resumes_without_snakemake_retry(cluster, tmp_path):
    snakefile = write_toy(tmp_path)
    log = tmp_path / "snakemake.out"
    proc = popen_snakemake_on_cluster(
        tmp_path, snakefile, extra_args=["train", "--retries", "0", "--config", "steps=40"], log=log)
    job, step = wait_for_progress(tmp_path, proc, min_step=5)
    # a job that needs every CPU of the node in the higher-priority partition preempts ours
    p = subprocess.run(
        ["sbatch", "--parsable", "-p", cluster.urgent_partition, "-c", str(cluster.cpus), "-t", "1",
         "-o", str(tmp_path / "urgent.out"), "--wrap", "sleep 2"],
        capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    output = finish(proc, log)
    assert proc.returncode == 0, f"{tail(output)}\n{slurm_logs(tmp_path)}"
    lines = attempts(tmp_path)
    assert any(l.startswith(f"job={job} got=SIGTERM") for l in lines), lines
    # the same SLURM job id ran again (requeued) and resumed
    assert sum(l.startswith(f"job={job} start=") for l in lines) == 2, lines
    result = json.loads((tmp_path / "train" / "result.json").read_text())
    assert result["job"] == job
    assert result["resumed_from"] >= step > 0, lines


def test_tiny_growlm_workflow_through_the_slurm_profile(cluster, tiny_run, tmp_path):
    """The real workflow (tiny config, one member, one method, GPU jobs on the fake GPU) through
    profiles/slurm-local; the scheduler shows the training jobs with the resources they asked for.
    The corpus, tokenizer, token files and member m_1 are those of the finished tiny run (a copy, its
    other models removed), so that the cluster runs M_0's training, the growth, the refinement and the
    evaluation jobs (the slow part here is the plugin's status polling)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import TINY

    wd = tiny_copy(tiny_run, tmp_path / "wf")
    overlay = wd / "slurm_overlay.yaml"
    overlay.write_text(
        "methods: [[hyperclone, zero_block]]\n"
        "n: [1]\n"  # hyperclone grows m_1 alone; a second member would only queue behind the others
        "controls: {single_member: false, ensemble: false}\n"
        "profile: {tools: []}\n"
        "resources: {gpu: 1, cpus_per_gpu: 1, mem_mb: 900, runtime: 15}\n"
        "train: {threads: 1}\n"
    )
    proc = run_snakemake_on_cluster(wd, wd / "workflow" / "Snakefile", configfiles=(TINY, overlay),
                                    extra_args=("results/tiny/eval/comparison.csv", "--verbose"), timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert (wd / "results/tiny/eval/comparison.csv").stat().st_size > 100
    sbatch = [line for line in proc.stdout.splitlines() if line.startswith("sbatch ") and "rule_train_baseline" in line]
    assert sbatch, "no sbatch line for train_baseline"
    assert "--gpus=1" in sbatch[0] and "--mem 900" in sbatch[0] and "-t 15" in sbatch[0], sbatch[0]
    # ask the scheduler itself (MinJobAge keeps finished jobs visible)
    logs = list((wd / ".snakemake" / "slurm_logs" / "rule_train_baseline").rglob("*.log"))
    assert logs, "no SLURM log of train_baseline"
    job_id = re.search(r"(\d+)\.log$", logs[0].name).group(1)
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in shown, shown
    assert "TimeLimit=00:15:00" in shown and re.search(r"gres/gpu[:=]1|gpu:1", shown), shown
    assert re.search(r"mem=900M", shown), shown
    # a job the SLURM executor submitted keeps the GPUs SLURM gave it: it claims none of its own
    log = (wd / "results/tiny/logs/train_baseline/d32_L2_t24000_lr0.003_s0.log").read_text()
    assert "GPUs placed by the scheduler" in log and "claimed for this job" not in log, log[:2000]


# ---------------------------------------------------------------------------------------------
# (f) jobs across the cluster's two nodes: M_0 and a refinement, then a requeued M_0
# ---------------------------------------------------------------------------------------------

BASELINE = "results/tiny/models/baseline/d32_L2/t24000_lr0.003/s0"
HYPERCLONE = "results/tiny/models/refined/hyperclone+zero_block/d16_L1_to_d32_L2/n{n}/t24000_lr0.003/s0"
REL = 1e-4  # two processes reduce a global batch in another order than one (tests/test_distributed.py)


def two_node_overlay(wd: Path, train: str = "threads: 1") -> Path:
    """The tiny experiment's training jobs on both nodes (one task each, the fake GPU of each node), gloo
    pinned to the loopback interface (both nodes are this host)."""
    overlay = wd / "two_nodes.yaml"
    overlay.write_text(
        "methods: [[hyperclone, zero_block]]\n"
        "controls: {single_member: false, ensemble: false}\n"
        "profile: {tools: []}\n"
        "resources: {gpu: 1, nodes: 2, cpus_per_gpu: 1, mem_mb: 900, runtime: 15}\n"
        f"train: {{{train}}}\n"  # one `train:` key: a key given twice is refused (growlm.config_files)
    )
    return overlay


MULTI = ("--set-resources", "train_baseline:slurm_partition=multi", "refine:slurm_partition=multi")


def curve(folder: Path) -> list[tuple[int, str, float]]:
    rows = list(csv.DictReader(open(folder / "ledger.csv")))
    return [(int(r["step"]), c, float(r[c])) for r in rows for c in ("train_loss", "val_loss") if r[c]]


def same_curve(got: Path, want: Path) -> None:
    a, b = curve(got), curve(want)
    assert [(s, c) for s, c, _ in a] == [(s, c) for s, c, _ in b], (got, want)
    for (step, col, x), (_, _, y) in zip(a, b):
        assert x == pytest.approx(y, rel=REL), (got, step, col, x, y)


def tiny_copy(tiny_run: Path, wd: Path, remove=("baseline", "refined", "grown")) -> Path:
    """The tiny run's folder (corpus, tokenizer, members) without the models the test trains again."""
    from conftest import copy_run

    return copy_run(tiny_run, wd, tiny=("eval", "report", "profile", "checkpoints",
                                        *(f"models/{kind}" for kind in remove)))


def test_m0_and_a_refinement_span_both_nodes_with_the_one_node_losses(cluster, tiny_run, tmp_path, monkeypatch):
    """resources.nodes: 2 through the SLURM profile: M_0 and the refinement each run as one SLURM job over
    both nodes (one task per node, gres per node, the CPUs per task asked for), one torchrun agent per
    node meeting at a rendezvous on the first; growlm.json and the plans table name both nodes and a
    world of two; the losses are those of the shared tiny run's one-process jobs with the same global
    batch."""
    from conftest import TINY

    wd = tiny_copy(tiny_run, tmp_path / "wf", remove=("baseline", "refined"))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # passed on to every process on every node
    overlay = two_node_overlay(wd)
    targets = (f"{BASELINE}/model.safetensors", f"{HYPERCLONE.format(n=2)}/model.safetensors",
               "results/tiny/report/plans.html")
    proc = run_snakemake_on_cluster(wd, wd / "workflow" / "Snakefile", configfiles=(TINY, overlay),
                                    extra_args=(*targets, "--verbose", *MULTI), timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + slurm_logs(wd)
    line = sbatch_line(proc.stdout, "train_baseline")
    for flag in ("-p multi", "--nodes=2", "--ntasks=2", "--cpus-per-task=1", "--gres=gpu:1"):
        assert re.search(rf"(^|\s){re.escape(flag)}(\s|$)", line), f"{flag!r} not in: {line}"
    assert "--gpus=" not in line and "--ntasks-per-gpu" not in line, line
    for folder in (BASELINE, HYPERCLONE.format(n=2)):
        where = json.loads((wd / folder / "growlm.json").read_text())["where"]
        assert where["world"] == 2 and sorted(where["nodes"]) == sorted(cluster.nodes), where
        assert sorted(r["node_rank"] for r in where["ranks"]) == [0, 1], where
        assert all(r["interfaces"] == {"GLOO_SOCKET_IFNAME": "lo"} and r["visible_devices"] == "0"
                   for r in where["ranks"]), where
        assert json.loads((wd / folder / "plan.json").read_text())["n_devices"] == 2
        same_curve(wd / folder, tiny_run / folder)
    log = (wd / "results/tiny/logs/train_baseline/d32_L2_t24000_lr0.003_s0.log").read_text()
    assert "launching 2 processes on SLURM nodes" in log and "srun --nodes=2 --ntasks=2" in log, log[-3000:]
    assert "step 93/93 (100%)" in log, log[-3000:]  # rank 0's progress, from whichever node it ran on
    plans = (wd / "results/tiny/report/plans.html").read_text()
    assert all(node in plans for node in cluster.nodes), plans


def wait_for_checkpoint(ckpt: Path, proc: subprocess.Popen, log: Path, timeout: float = 300) -> str:
    """The SLURM job id of the training job once it has written its first checkpoint."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(f"snakemake ended early (rc {proc.returncode}):\n{tail(log.read_text())}")
        if ckpt.is_dir() and any(p.name.startswith("step_") for p in ckpt.iterdir()):
            jobs = subprocess.run(["squeue", "-h", "-t", "running", "-o", "%i %k"], capture_output=True,
                                  text=True).stdout.split("\n")
            ids = [j.split()[0] for j in jobs if "rule_train_baseline" in j]
            if ids:
                return ids[0]
        time.sleep(0.1)
    pytest.fail(f"no checkpoint in {ckpt} after {timeout} s:\n{tail(log.read_text())}")


def test_a_job_across_nodes_requeued_mid_run_resumes_to_the_same_numbers(cluster, tiny_run, tmp_path, monkeypatch):
    """SLURM requeues a two-node M_0 while it trains (`scontrol requeue`: SIGTERM to both nodes' tasks, as
    preemption does): the agents pass it to their processes, which stop at one step together, rank 0
    writes a checkpoint, and the same SLURM job, started again, re-forms its world at a new rendezvous and
    resumes from it; the model it ends with has the losses of the same job run without interruption in
    one process."""
    from conftest import TINY, run_snakemake

    extra = "threads: 1, checkpoint_every: 20, large: {tokens: 204800}"  # 800 steps
    wd = tiny_copy(tiny_run, tmp_path / "wf")
    overlay = two_node_overlay(wd, extra)
    target = f"{BASELINE.replace('t24000', 't204800')}/model.safetensors"
    log = tmp_path / "snakemake.out"
    proc = popen_snakemake_on_cluster(wd, wd / "workflow" / "Snakefile", configfiles=(TINY, overlay),
                                      extra_args=(target, "--retries", "0", *MULTI), log=log)
    ckpt = wd / Path(target).parent.as_posix().replace("/models/", "/checkpoints/")
    job = wait_for_checkpoint(ckpt, proc, log)
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    output = finish(proc, log, timeout=600)
    assert proc.returncode == 0, output[-5000:] + slurm_logs(wd)
    model = wd / Path(target).parent
    # the started-again job's log (Snakemake replaces the first attempt's) resumes from where it stopped
    job_log = (wd / "results/tiny/logs/train_baseline/d32_L2_t204800_lr0.003_s0.log").read_text()
    resumed = re.search(r"resumed from checkpoint step_\d+ \(step (\d+)\)", job_log)
    assert resumed and 0 < int(resumed.group(1)) < 800, job_log[-4000:]
    assert "launching 2 processes on SLURM nodes" in job_log, job_log[-4000:]
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in shown and "Restarts=1" in shown, shown  # the same job, started again

    ref = tiny_copy(tiny_run, tmp_path / "ref")  # the same job without interruption, one process, no SLURM
    (ref / "one.yaml").write_text(f"train: {{{extra}}}\n")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run_snakemake(ref, target, "--cores", "1", "--configfile", str(TINY), str(ref / "one.yaml"))
    same_curve(model, ref / Path(target).parent)
