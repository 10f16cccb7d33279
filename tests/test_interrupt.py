"""After an interruption the user is told the one command that continues, and nothing is lost.

kill -9 of Snakemake: its training job does not run on as an orphan; it gets SIGTERM, writes a
checkpoint and stops; killed in the job's first seconds, while the job still imports torch, the job
stops as soon as it finds its Snakemake gone, before any work. The next run prints the command that continues (Snakemake's lock is left
behind; incomplete outputs are made again, `rerun-incomplete` in the workflow profile), and that
command resumes the job from its checkpoint. Ctrl-C (SIGINT to the process group): the job stops at a
checkpoint instead of being lost, says so, and the next plain run resumes it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import SNAKEMAKE, TINY

LONG = """
n: [1]
methods: [[hyperclone, zero_block]]
controls: {single_member: false, ensemble: false}
profile: {tools: []}
train: {small: {tokens: 256000}, checkpoint_every: 50}  # 1000 steps, about 3 s of training
"""
TARGET = "results/tiny/models/small/d16_L1/s0/m1/model.safetensors"
LOG = "results/tiny/logs/train_small/d16_L1_s0_m1.log"


def start(wd: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [*SNAKEMAKE, "--cores", "1", TARGET, "--configfile", str(TINY), str(wd / "long.yaml"), *extra]
    return subprocess.Popen(cmd, cwd=wd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def wait_for_training(wd: Path, timeout: float = 240) -> None:
    """Until the member's job has trained past its first checkpoint (step 50; the log has a line every 20
    steps, at each evaluation): the run is interrupted early in its 1000 steps, and what the run that
    resumes it trains again is short."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = wd / LOG
        steps = [int(s) for s in re.findall(r"\] step (\d+)/", log.read_text())] if log.is_file() else []
        if steps and max(steps) >= 60:
            return
        time.sleep(0.1)
    raise AssertionError(f"the training job did not get going:\n{(wd / LOG).read_text() if (wd / LOG).is_file() else ''}")


def job_processes(wd: Path) -> list[int]:
    """Processes of this workflow's training scripts (Snakemake runs each job's script directly)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            if "train_small" in cmd and os.readlink(proc / "cwd") == str(wd):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.fixture
def long_run(tiny_run, tmp_path):
    """A copy of the finished tiny run (its corpus and tokens are reused) whose member now trains longer:
    the member's job runs again, long enough to be interrupted."""
    wd = (tmp_path / "wf").resolve()
    shutil.copytree(tiny_run, wd, symlinks=True)
    (wd / "long.yaml").write_text(LONG)
    return wd


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_kill_9_of_snakemake_stops_the_job_and_the_next_run_says_how_to_continue(long_run):
    wd = long_run
    proc = start(wd)
    wait_for_training(wd)
    assert job_processes(wd)
    os.kill(proc.pid, signal.SIGKILL)  # Snakemake alone, as `kill -9 <pid>` would
    proc.wait()
    deadline = time.monotonic() + 60
    while job_processes(wd) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not job_processes(wd), "the training job ran on after Snakemake was killed"
    log = (wd / LOG).read_text()
    assert re.search(r"SIGTERM after step \d+/\d+: checkpoint written", log), log[-2000:]
    assert list((wd / ".snakemake" / "locks").glob("*.lock")), "expected Snakemake's lock to be left behind"

    again = subprocess.run([*SNAKEMAKE, "-n", "--cores", "1", TARGET, "--configfile", str(TINY), str(wd / "long.yaml")],
                           cwd=wd, capture_output=True, text=True)
    notice = re.search(r"this command continues the run:\n    (.+)", again.stderr)
    assert notice, again.stdout[-2000:] + again.stderr[-2000:]
    command = notice.group(1)
    assert "--unlock && " in command and "-n" in command
    # the printed command, as the user would paste it, without the dry-run flag of this check
    done = subprocess.run(command.replace(" -n ", " "), shell=True, cwd=wd, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (wd / TARGET).is_file()
    assert re.search(r"resumed from checkpoint step_\d+", (wd / LOG).read_text())


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_kill_9_of_snakemake_at_a_jobs_start_leaves_no_orphan(long_run):
    """Killed while its job still imports torch, before the job could ask for the parent-death signal: the
    job finds its Snakemake gone and stops at once, instead of training to the end with no one to see it."""
    wd = long_run
    proc = start(wd)
    deadline = time.monotonic() + 120
    while not job_processes(wd) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert job_processes(wd), "the training job did not start"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while job_processes(wd) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not job_processes(wd), "the training job ran on after Snakemake was killed"
    log = (wd / LOG).read_text() if (wd / LOG).is_file() else ""
    assert "is gone; stopping before any work" in log, log[-2000:]
    assert not re.search(r"\] step \d+/", log) and not (wd / TARGET).is_file()


def test_the_continuing_command_unlocks_the_folder_of_the_run(tmp_path):
    """A run started elsewhere (`--directory`, its own Snakefile and config) is unlocked by the same command:
    a bare `snakemake --unlock` would unlock the folder the user stands in, and the run would stop again."""
    from growlm.interrupted import interrupted_run_notice

    (tmp_path / ".snakemake" / "locks").mkdir(parents=True)
    (tmp_path / ".snakemake" / "locks" / "0.input.lock").write_text("")
    argv = ["snakemake", "-s", "/wf/Snakefile", "--directory", str(tmp_path), "--configfile", "a b.yaml", "--cores", "2"]
    command = interrupted_run_notice(tmp_path, argv).splitlines()[-1].strip()
    unlock, again = command.split(" && ")
    assert unlock == f"{again} --unlock" and f"--directory {tmp_path}" in unlock and "'a b.yaml'" in unlock


@pytest.mark.slow
def test_ctrl_c_stops_the_training_job_at_a_checkpoint(long_run):
    wd = long_run
    proc = start(wd)
    wait_for_training(wd)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    log = (wd / LOG).read_text()
    assert re.search(r"SIGINT after step \d+/\d+: checkpoint written to .*Run the workflow again", log), log[-2000:]
    assert "Run the workflow again" in out  # Snakemake shows the failed job's log (show-failed-logs)
    done = subprocess.run([*SNAKEMAKE, "--cores", "1", TARGET, "--configfile", str(TINY), str(wd / "long.yaml")],
                          cwd=wd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(r"resumed from checkpoint step_\d+", (wd / LOG).read_text())
