"""Which GPUs a job of a local run uses: devices of its own, which no other running job holds.

Snakemake counts a `gpu` resource - it never runs more GPU jobs at once than the machine has GPUs
(`register_machine_gpus` gives a local run that count) - but it assigns no device to a job: every
job would see every GPU and start on the first. So a job that asks for G GPUs claims G devices
here before it touches CUDA, and sets `CUDA_VISIBLE_DEVICES` to them: the job (and its torchrun
processes) sees exactly those, as `cuda:0` ... `cuda:G-1`, and its memory planner plans for the
GPU it got.

A device is claimed by an exclusive `flock` on its lock file (`<locks>/gpu-<id>.<slot>.lock`, default
folder /tmp/growlm-gpus, one per machine: devices belong to a machine, and two Snakemake runs on
it share them too). A device has one slot, or k when k jobs share it (`resources.gpu_share: 1/k`; the
Snakefile passes k on as $GROWLM_GPU_SLOTS): a job takes one slot on each of its devices. Runs that
share a machine at the same time use the same share. The kernel releases a lock when the last process holding its open file ends,
however it ends (SIGKILL included), so a killed job's devices are free again at once, and nothing
has to clean up. The job's torchrun processes inherit the open files (`held_fds`), so its devices
stay claimed until its last process is gone. A job that finds fewer free devices than it needs (a
job of another run on this machine, or processes of a killed job still ending) waits, saying every
minute who holds them.

The machine's devices: $GROWLM_GPUS if set (e.g. "0,1,2,3": a list of device ids, also how to
keep growlm to some GPUs), else $CUDA_VISIBLE_DEVICES if set, else what `nvidia-smi` lists, else
none (a job that asks for a GPU then trains on the CPU, as before). Inside a SLURM job nothing is
claimed: SLURM placed the job's GPUs (gres) and set CUDA_VISIBLE_DEVICES itself.

Torch-free: the Snakefile reads the machine's devices while Snakemake parses it.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

POOL_ENV = "GROWLM_GPUS"
LOCKS_ENV = "GROWLM_GPU_LOCKS"
SLOTS_ENV = "GROWLM_GPU_SLOTS"
DEFAULT_LOCKS = "/tmp/growlm-gpus"
SAY_EVERY_S = 60.0

_HELD: list[int] = []  # the open lock files of this process's claim (inherited by its torchrun processes)


def machine_gpus(environ: dict | None = None) -> list[str]:
    """The device ids jobs on this machine share (see the module docstring for where they come from)."""
    env = os.environ if environ is None else environ
    for name in (POOL_ENV, "CUDA_VISIBLE_DEVICES"):
        if name in env:
            return [d.strip() for d in env[name].split(",") if d.strip() and d.strip() != "-1"]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().isdigit()] if out.returncode == 0 else []


def slots_per_gpu(gpu_share: float) -> int:
    """How many jobs share one GPU when each may plan for `gpu_share` of it."""
    return max(1, int(round(1 / gpu_share)))


def in_slurm_job(environ: dict | None = None) -> bool:
    """Whether this process runs inside a SLURM allocation (SLURM placed its GPUs)."""
    return "SLURM_JOB_ID" in (os.environ if environ is None else environ)


def locks_dir() -> Path:
    path = Path(os.environ.get(LOCKS_ENV) or DEFAULT_LOCKS)
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        try:
            path.chmod(0o1777)  # every user's jobs share the machine's devices
        except OSError:
            pass
    return path


def _lock_file(device: str, slot: int = 0) -> Path:
    return locks_dir() / f"gpu-{re.sub(r'[^A-Za-z0-9_-]', '_', device)}.{slot}.lock"


def holders(device: str, slots: int = 1) -> str:
    """Who holds a device's slots, as the holders wrote it ("pid 123, rule train_small, /path/to/run")."""
    out = []
    for slot in range(slots):
        try:
            out.append(_lock_file(device, slot).read_text().strip())
        except OSError:
            pass
    return " | ".join(h for h in out if h)


def _try(device: str, slot: int) -> int | None:
    """An open lock file of a device's slot with its exclusive lock taken, or None when another process
    holds it."""
    path = _lock_file(device, slot)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file: a shared lock is enough to test, but not to hold
        fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@dataclass
class Claim:
    """The devices a job holds (ids as the machine names them), and the open lock files that hold them."""

    devices: list[str]
    fds: list[int] = field(default_factory=list)
    placed_by: str = "growlm"  # "growlm", "slurm" or "none"

    def release(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
            if fd in _HELD:
                _HELD.remove(fd)
        self.fds = []


def held_fds() -> list[int]:
    """The open lock files of this process's claim, for its child processes to inherit (`pass_fds`)."""
    return list(_HELD)


def _take(device: str, slots: int) -> int | None:
    """A free slot of `device`, taken (its open lock file), or None when all are held."""
    for slot in range(slots):
        fd = _try(device, slot)
        if fd is not None:
            return fd
    return None


def claim(count: int, *, who: str = "", log=print, slots: int | None = None,
          say_every_s: float = SAY_EVERY_S) -> Claim:
    """Claim `count` devices of this machine for this process (a slot on each: `slots` per device, default
    $GROWLM_GPU_SLOTS or 1) and set CUDA_VISIBLE_DEVICES to them (see the module docstring); wait while
    fewer are free. Inside a SLURM job, or when the job asks for none or the machine has none, nothing is
    claimed and the environment is left as it is."""
    if count <= 0:
        return Claim([], placed_by="none")
    if in_slurm_job():
        devices = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        log(f"GPUs placed by SLURM: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
        return Claim(devices, placed_by="slurm")
    pool = machine_gpus()
    if not pool:
        log(f"asks for {count} GPU{'s' if count > 1 else ''}; this machine has none: the job runs on the CPU")
        return Claim([], placed_by="none")
    if count > len(pool):
        log(f"asks for {count} GPUs; this machine has {len(pool)} ({','.join(pool)}): it takes all of them")
        count = len(pool)
    slots = slots or int(os.environ.get(SLOTS_ENV, "1") or 1)
    stamp = f"pid {os.getpid()}, {who or 'a growlm job'}, {os.getcwd()}"
    start = said = time.monotonic()
    first = True
    while True:
        got: list[tuple[str, int]] = []
        for device in pool:
            fd = _take(device, slots)
            if fd is not None:
                got.append((device, fd))
                if len(got) == count:
                    break
        if len(got) == count:
            break
        for _, fd in got:
            os.close(fd)
        now = time.monotonic()
        if first or now - said >= say_every_s:
            busy = "; ".join(f"{d}: {holders(d, slots) or 'held'}" for d in pool if d not in {g for g, _ in got})
            log(f"waiting for {count} free GPU{'s' if count > 1 else ''} of {','.join(pool)} "
                f"({now - start:.0f} s so far); held: {busy}")
            said, first = now, False
        time.sleep(0.5)
    for device, fd in got:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{stamp}\n".encode(), 0)
        except OSError:  # a lock file opened read-only (another user's): held all the same
            pass
    claimed = Claim([d for d, _ in got], [fd for _, fd in got])
    _HELD.extend(claimed.fds)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(claimed.devices)
    log(f"GPU{'s' if count > 1 else ''} {','.join(claimed.devices)} of {','.join(pool)} claimed for this job "
        f"(CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})")
    return claimed
