"""The one exception type for problems a user can fix (bad config, missing or damaged file, NaN loss),
and the boundaries where it becomes one line of text instead of a traceback.

Entry points catch it and print one line naming the cause; any other exception is our bug and keeps
its traceback. `job_log` is that boundary for a workflow job (its output goes to the job's log);
`user_errors` for a command-line entry point. `damaged` is the error for a file a job reads that is
not whole (it names the command that rebuilds it); `read_json` and `check_recorded_sha256` raise it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import signal
import os
import select
import sys
import threading
import time
import traceback
from pathlib import Path

from growlm import hints


class GrowlmError(Exception):
    """A user-facing problem: the message names the cause and what to do."""


def damaged(path: str | Path, reason: str) -> GrowlmError:
    """The error for a file a job reads that is not whole: it names the file, what is wrong, and the
    one line that rebuilds it and continues: the user's own command with the file forced
    (`growlm.hints.rebuild`; Snakemake reruns the job that made it), then the command as they ran it."""
    return GrowlmError(f"{path} is damaged ({reason}); rebuild it and continue with `{hints.rebuild(path)}`")


def read_json(path: str | Path) -> dict:
    """A JSON file a job reads: missing or broken is a one-line error naming it."""
    path = Path(path)
    if not path.is_file():
        raise GrowlmError(f"{path} is missing; make it with `{hints.with_targets(hints.rebuild_target(path))}`")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise damaged(path, f"not valid JSON: {err}") from None


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record_sha256(path: str | Path) -> None:
    """Write `<path>.sha256` beside a file a job wrote, for `check_recorded_sha256` in later jobs."""
    Path(f"{path}.sha256").write_text(sha256(path) + "\n")


def digest(path: str | Path) -> str:
    """A file's sha256: the one recorded when a job wrote it (`record_sha256`; the readers check the
    file against it), else computed."""
    record = Path(f"{path}.sha256")
    if record.is_file():
        return record.read_text().strip()
    return sha256(path)


def check_recorded_sha256(path: str | Path) -> None:
    """Raise the damaged-file error when `path`'s content is not what `record_sha256` recorded (a file
    with no record, e.g. one written by hand, is taken as it is)."""
    record = Path(f"{path}.sha256")
    if record.is_file() and sha256(path) != record.read_text().strip():
        raise damaged(path, "its content differs from the sha256 recorded when it was written")


@contextlib.contextmanager
def user_errors(stage: str):
    """Turn a GrowlmError into a one-line message on stderr and exit status 1."""
    try:
        yield
    except GrowlmError as err:
        print(f"growlm {stage}: error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)


def package_env(env: dict | None = None) -> dict:
    """The environment of a child Python that must import this very growlm (installed or not, and
    whatever another installed copy says): `env` (default: this process's) with this package's folder
    first on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    root = str(Path(__file__).resolve().parents[1])
    out["PYTHONPATH"] = os.pathsep.join(p for p in (root, out.get("PYTHONPATH", "")) if p)
    return out


PARENT_ENV = "GROWLM_PARENT_PID"  # the process whose death must stop this one (set by whoever starts it)


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])  # the field after the state, past the command's name


def _start_time(pid: int) -> str | None:
    """When process `pid` started (field 22 of /proc/PID/stat, in clock ticks since boot), or None when it is
    gone: with the pid, what names one process (a pid alone may be reused once it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


WATCH_POLL_S = 0.5  # how often a watch without a pidfd (Linux before 5.3) looks at the watched process


def watch_process(pid: int, signum: int = signal.SIGTERM) -> bool:
    """Send this process `signum` as soon as process `pid` has ended, whoever its parent is: a daemon thread
    waits on a pidfd of it (`os.pidfd_open`, Linux 5.3 and later), or looks at /proc every WATCH_POLL_S
    (the pid with its start time, so that a reused pid is no false life). Returns False when `pid` is gone
    already (nothing is watched then).

    Why not only the parent-death signal: PR_SET_PDEATHSIG follows the immediate parent, and between a
    job and its Snakemake there may be a shell that outlives Snakemake. Snakemake runs a script as
    `bash -c "set -euo pipefail; python ..."`, and only bash 5.1 and later exec that last command (bash's
    NEWS for 5.1, item 1b): under bash 4.4 (RHEL 8, Rocky 8) or 5.0 (Ubuntu 20.04) the job's parent is a
    bash that is still there after `kill -9` of Snakemake, and the job would train on, holding its GPU lock
    and writing the checkpoint folder the next run resumes from. The signal itself is what a training job
    handles already (`growlm.train`: it writes a checkpoint and exits between steps); a job without a
    handler ends at once."""
    me = os.getpid()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd here: poll /proc
        fd = None
    since = _start_time(pid)
    if fd is None and since is None:
        return False

    def wait() -> None:
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll():
                pass
            os.close(fd)
        else:
            while _start_time(pid) == since:
                time.sleep(WATCH_POLL_S)
        os.kill(me, signum)

    threading.Thread(target=wait, name=f"growlm-watch-{pid}", daemon=True).start()
    return True


def stop_with_parent(parent: int | None = None, say=None) -> None:
    """Linux: have this process get SIGTERM when the process that started it dies (a job whose Snakemake
    was killed stops instead of running on as an orphan; a training job then writes a checkpoint first), and
    stop at once if that process is gone already. That one is `parent`, else $GROWLM_PARENT_PID (the
    Snakefile of a local run names its own process there for its jobs, `growlm.launch` the job for the
    processes it starts, `growlm.node_agent` itself for its workers): a job whose Snakemake was killed while
    the job was still importing torch would otherwise train to the end unseen.

    Two watches, both set before the check: the parent-death signal (PR_SET_PDEATHSIG) for the immediate
    parent, and `watch_process` for `parent` itself, which may be a grandparent: a shell between the two
    (bash before 5.1, which does not exec the last command of `bash -c`; a conda environment's) outlives
    it. The check follows the chain of parents, so such a shell is no stop either; `say` tells why it
    stops (default: on stderr). Elsewhere, or if the calls are refused, nothing happens."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is None:
        parent = int(os.environ.get(PARENT_ENV) or 0) or None
    if parent is None or parent == os.getpid() or not Path("/proc/self").exists():
        return
    watched = watch_process(parent)  # from here on, its end sends SIGTERM, whatever lies between
    pid, seen = os.getppid(), 0
    while watched and pid and pid > 1 and seen < 64:
        if pid == parent:
            return
        pid, seen = _parent_of(pid), seen + 1
    line = f"the process that started this one (pid {parent}) is gone; stopping before any work"
    if say is None:
        os.write(2, f"growlm: {line}\n".encode())
    else:
        say(line)
    os._exit(1)


def disk_full(err: BaseException) -> str | None:
    """One line for an error that says the disk is full (errno ENOSPC, or safetensors' "os error 28"),
    else None: a job that fills the disk stops with this line, not a traceback, and what it had saved
    stays (a checkpoint is written to a temporary name and renamed only when whole)."""
    text = f"{type(err).__name__}: {err}"
    if getattr(err, "errno", None) == errno.ENOSPC or "os error 28" in text or "No space left on device" in text:
        where = getattr(err, "filename", None)
        return (f"no space left on the disk{f' writing {where}' if where else ''} ({text.splitlines()[0][:200]}); "
                f"free some space (`df -h .`; old checkpoints under results/**/checkpoints/ of finished runs can go) "
                f"and run the workflow again: finished jobs stay, a training job resumes from its last checkpoint")
    return None


LIBRARY_ENV = "GROWLM_LIBRARY"  # the workflow's own copy of the library, set by the Snakefile for its jobs


def export_library(scripts_dir: str | Path) -> None:
    """Make `scripts_dir` (the workflow's folder that holds growlm) the first place every job of this run
    imports growlm from: PYTHONPATH first, and named in GROWLM_LIBRARY for `library_problem`. Snakemake
    runs a job's script with its folder put after site-packages, where another installed growlm would
    win. Nothing when the folder holds no growlm (a workflow read from Snakemake's source cache)."""
    scripts = str(Path(scripts_dir).resolve())
    if not Path(scripts, "growlm").is_dir():
        return
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != scripts]
    os.environ["PYTHONPATH"] = os.pathsep.join([scripts, *rest])
    os.environ[LIBRARY_ENV] = str(Path(scripts, "growlm"))


def library_problem() -> str | None:
    """Why this process runs another copy of growlm than the workflow it is a job of (the Snakefile names
    its own in GROWLM_LIBRARY), or None: the job would compute with another library than the one whose
    checks the run passed."""
    expected, here = os.environ.get(LIBRARY_ENV), Path(__file__).resolve().parent
    if not expected or Path(expected).resolve() == here:
        return None
    return (f"this job imported growlm from {here}, but its workflow's library is {expected}: another growlm comes "
            f"first on this Python's path (an installed copy, or PYTHONPATH); run the workflow in an environment "
            f"where its own copy comes first (pip uninstall growlm, or pip install -e the workflow's checkout)")


@contextlib.contextmanager
def job_log(log_file: str | Path, stage: str):
    """Send stdout and stderr to the job's log (its first line says which copy of the library runs);
    a GrowlmError becomes one line (in the log and on the terminal) and exit status 1, with no
    traceback. A job that runs another copy of growlm than its workflow's stops at once, naming both
    (`library_problem`). The job stops when the Snakemake that started it dies, or at once if it is gone
    already (`stop_with_parent`). A job's GPUs are claimed inside it (`growlm.launch.job_devices`), so
    that what the claim says goes to the log too."""
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", buffering=1) as fh:
        stop_with_parent(say=lambda line: print(f"growlm {stage}: {line}", file=fh, flush=True))
        print(f"growlm {stage}: library {Path(__file__).resolve().parent}", file=fh, flush=True)
        try:
            problem = library_problem()
            if problem:
                raise GrowlmError(problem)
            with contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
                yield
        except GrowlmError as err:
            msg = f"growlm {stage}: error: {err}"
            print(msg, file=fh, flush=True)
            print(msg, file=sys.__stderr__, flush=True)
            sys.exit(1)
        except Exception as err:
            full = disk_full(err)
            if full:  # the machine's problem, not a bug: one line (the traceback stays in the log)
                traceback.print_exc(file=fh)
                msg = f"growlm {stage}: error: {full}"
                print(msg, file=fh, flush=True)
                print(msg, file=sys.__stderr__, flush=True)
                sys.exit(1)
            # a bug, not a user-level problem: its traceback goes to the log as well
            traceback.print_exc(file=fh)
            raise
