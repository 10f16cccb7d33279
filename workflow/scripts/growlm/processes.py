"""The processes a job starts: each ends with the job and holds the job's devices until it has ended
(`growlm.launch` decides what they are; this module starts, stops and reaps them).

- `start`: a process started through a small exec wrapper (`WITH_PARENT`) that asks for SIGTERM at the
  job's death (PR_SET_PDEATHSIG, which survives exec) and stops at once if the job is gone already; it
  inherits the job's GPU locks (`pass_fds`) and learns their descriptors (`growlm.gpus.HELD_ENV`) to hand
  them on; the job becomes a subreaper (PR_SET_CHILD_SUBREAPER), so a process whose parent was killed
  becomes the job's child, not init's;
- `stopping`: while the job waits for it, a SIGTERM to the job (its Snakemake died, SLURM's time limit)
  goes on to the launch, and the job waits for every process left its child (`reap`: SIGTERM, then
  SIGKILL after a grace time) before it returns - so the job's locks outlive them all;
- `run_processes`: both, for a launch whose exit status the job waits for.

Torch-free (the Snakefile imports `growlm.launch`, which imports this).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from growlm import gpus
from growlm.errors import PARENT_ENV, GrowlmError, package_env

GRACE_S = 60.0  # how long a job waits for its launch's processes to stop after SIGTERM before SIGKILL


def _subreaper() -> None:
    """Linux: orphaned descendants of this process become its children (PR_SET_CHILD_SUBREAPER)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1)
    except (OSError, AttributeError):
        pass


def _children() -> list[int]:
    """This process's child processes (Linux's /proc)."""
    me, kids = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == me:
            kids.append(int(stat.parent.name))
    return kids


def reap(grace_s: float = GRACE_S, log=print, *, keep: set[int] | frozenset = frozenset()) -> list[int]:
    """Wait until this process has no child left but `keep`: SIGTERM to those still running, SIGKILL after
    `grace_s`. Returns the ones it found (a launch's processes whose parent died before them)."""
    found: list[int] = []
    deadline = None
    while kids := [k for k in _children() if k not in keep]:
        new = [k for k in kids if k not in found]
        found += new
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        if new and deadline is None:
            deadline = time.monotonic() + grace_s
            log(f"waiting for {len(kids)} process(es) of the launch whose parent died "
                f"(pids {', '.join(map(str, kids))})")
        for pid in kids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        if deadline is not None and time.monotonic() > deadline:
            for pid in kids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    return found


# The small exec wrapper a job's processes start through: it asks for SIGTERM at its parent's death
# (PR_SET_PDEATHSIG, which survives exec), stops if that parent is gone already, and execs the command.
# The setting is made in the new process itself, not from subprocess's preexec_fn: the job has threads (a
# watch of its run, a log reader), and Python's subprocess docs warn that preexec_fn is not safe in a
# process with threads (the child may deadlock on a lock another thread held at fork).
WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('growlm: the job that started this process (pid %s) is gone; stopping' % sys.argv[1])\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as err:\n"
    "    sys.exit('growlm: cannot run %s: %s' % (sys.argv[2], err))\n"
)


def _program(cmd0: str, env: dict) -> str:
    """The program a command runs, as Popen would find it; OSError (as Popen raises it) when there is none."""
    if os.sep in cmd0:
        if os.path.isfile(cmd0) and os.access(cmd0, os.X_OK):
            return cmd0
        raise FileNotFoundError(errno.ENOENT, "no such executable", cmd0)
    found = shutil.which(cmd0, path=env.get("PATH", os.defpath))
    if not found:
        raise FileNotFoundError(errno.ENOENT, "not found on PATH", cmd0)
    return cmd0


def start(cmd: list[str], *, env: dict | None = None, new_session: bool = False, **popen) -> subprocess.Popen:
    """Start a process of this job (see the module docstring) through `WITH_PARENT`: it inherits the job's GPU
    locks (and learns their descriptors, `growlm.gpus.HELD_ENV`, to hand them on), gets SIGTERM when this
    process dies (or stops at once if this one is gone already), and this process becomes a subreaper for
    it and everything it starts. `new_session`: in a session of its own (a profiler, so that a timeout can
    end all it started; Popen does that without preexec_fn); `popen`: the rest of subprocess.Popen's
    arguments. A command that is not there raises OSError here, as Popen would."""
    _subreaper()
    me, held = os.getpid(), gpus.held_fds()
    cmd = [str(c) for c in cmd]
    full_env = {**package_env(env), PARENT_ENV: str(me), gpus.HELD_ENV: ",".join(map(str, held))}
    _program(cmd[0], full_env)
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", WITH_PARENT, str(me), *cmd], env=full_env,
                            pass_fds=held, start_new_session=new_session, **popen)


@contextlib.contextmanager
def stopping(proc: subprocess.Popen, *, log=print, grace_s: float = GRACE_S, group: bool = False):
    """While the job waits for `proc` (started with `start`): a SIGTERM to the job goes on to it (to its
    process group: `group`) and is remembered; when the block ends, the job waits for every process that
    was left its child meanwhile (`reap`). Raises GrowlmError after a SIGTERM, once all have ended."""
    stopped: list[int] = []
    before = set(_children()) - {proc.pid}

    def forward(signum, _frame):
        stopped.append(signum)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signum) if group else proc.send_signal(signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, forward) if main else None
    try:
        yield
    finally:
        try:
            proc.wait()
            reap(grace_s, log, keep=before)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
    if stopped:
        raise GrowlmError(f"stopped by SIGTERM; what it had started ended (exit {proc.returncode}); the job "
                          "resumes from its last checkpoint when rerun")


def run_processes(cmd: list[str], *, log=print, stdout=None, stderr=None, env: dict | None = None,
                  grace_s: float = GRACE_S) -> int:
    """Run a job's launch (`cmd`) as described in the module docstring, and return its exit status; a
    SIGTERM to the job stops the launch first, then raises GrowlmError."""
    proc = start(cmd, env=env, stdout=stdout, stderr=stderr)
    with stopping(proc, log=log, grace_s=grace_s):
        proc.wait()
    return proc.returncode
