"""Which GPUs a job of a local run uses: devices of its own, which no other running job holds.

Snakemake counts a `gpu` resource - it never runs more GPU jobs at once than the machine has GPUs
(the Snakefile gives a local run that count) - but it assigns no device to a job: every job would
see every GPU and start on the first. So a job that asks for G GPUs claims G devices here before it
touches CUDA, and sets `CUDA_VISIBLE_DEVICES` to them: the job (and every process it starts) sees
exactly those, as `cuda:0` ... `cuda:G-1`, and its memory planner plans for the GPU it got.

A job claims whenever its run is local, also inside a SLURM allocation (`salloc --gres=gpu:8`, then
`snakemake --cores all` there): SLURM placed the run, not each job, and the jobs share the
allocation's devices as on a workstation. Only a job that a cluster executor submitted (the Snakefile
sets $GROWLM_GPUS_PLACED_BY=scheduler for those) leaves its GPUs to the scheduler, which gave it its own.

A device is claimed by an exclusive `flock` on a lock file (`<locks>/gpu-<key>.<slot>.lock`, default
folder /tmp/growlm-gpus, one per machine: devices belong to a machine, and two Snakemake runs on it
share them too). The key is what identifies the device on the machine, its UUID where `nvidia-smi`
gives one: an allocation that constrains devices renumbers them from 0, and two allocations on one
node may share /tmp, so two jobs' "GPU 0" may be different devices. A lock file is made readable and
writable by everyone (mode 0666 whatever the umask), so that another user's run on the machine can
test it. A device has one slot, or k when k jobs share it (`resources.gpu_share`, the number 1/k: 0.5 for two; a
share for which the jobs of a GPU would plan for more than all of it is refused, `share_problem`; the Snakefile passes k on as $GROWLM_GPU_SLOTS): a job
takes one slot on each of its devices, and the least busy devices first, so that shared jobs spread over
the free GPUs before doubling up; one claim at a time ranks and takes (`_claiming`), so that two jobs
started together do not both take the same free device. Runs
that share a machine at the same time use the same share. The kernel releases a lock when the last
process holding its open file ends, however it ends (SIGKILL included), so nothing has to clean up;
every process a job starts holds the open files too (`growlm.launch` passes them on), so a job's
devices stay claimed until its last process is gone. A job that finds fewer free devices than it
needs waits, saying every minute who holds them.

The machine's devices: $GROWLM_GPUS if set (e.g. "0,1,2,3": a list of device ids, also how to keep
growlm to some GPUs), else $CUDA_VISIBLE_DEVICES if set, else what `nvidia-smi` lists, else none (a
job that asks for a GPU then trains on the CPU). An id is a device index, or a `GPU-`/`MIG-` UUID as
CUDA takes them; a list with an id twice, or with anything else, is refused before any job
(`pool_problem`). Jobs get `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so that an index means the device
`nvidia-smi` shows with it (CUDA's own default order puts the fastest device first).

Torch-free: the Snakefile reads the machine's devices while Snakemake parses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import socket
import stat
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from growlm.errors import GrowlmError

POOL_ENV = "GROWLM_GPUS"
LOCKS_ENV = "GROWLM_GPU_LOCKS"
SLOTS_ENV = "GROWLM_GPU_SLOTS"
HELD_ENV = "GROWLM_GPU_LOCK_FDS"  # the lock files a process inherited, by descriptor (growlm.processes.start sets it)
HAND_ON_ENV = "GROWLM_GPU_LOCK_SOCKET"  # where a torchrun agent hands its workers the job's lock files
PLACED_ENV = "GROWLM_GPUS_PLACED_BY"  # "scheduler": a cluster executor submitted this job with its own GPUs
DEVICE_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # an index means what nvidia-smi shows with it
DEFAULT_LOCKS = "/tmp/growlm-gpus"
SAY_EVERY_S = 60.0
_ID = re.compile(r"^(\d+|(GPU|MIG)-[0-9A-Za-z/-]+)$")

_HELD: list[int] = []  # the open lock files of this process's claim (every process the job starts inherits them)


def _pool_source(env) -> tuple[str | None, list[str]]:
    for name in (POOL_ENV, "CUDA_VISIBLE_DEVICES"):
        if name in env:
            return name, [d.strip() for d in env[name].split(",") if d.strip() and d.strip() != "-1"]
    return None, []


def _smi() -> list[tuple[str, str]]:
    """(index, uuid) of every device `nvidia-smi` lists, in its order; [] without it."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    rows = [[f.strip() for f in line.split(",")] for line in out.stdout.splitlines()]
    return [(r[0], r[1] if len(r) > 1 else "") for r in rows if r and r[0].isdigit()]


def machine_gpus(environ: dict | None = None) -> list[str]:
    """The device ids jobs on this machine share (see the module docstring for where they come from)."""
    env = os.environ if environ is None else environ
    name, ids = _pool_source(env)
    return ids if name else [index for index, _ in _smi()]


def pool_problem(environ: dict | None = None) -> str | None:
    """Why the machine's device list cannot be used (an id given twice, or one that is no device id), or
    None: a repeated id would have a job wait forever for a second device that is the first, and `a,b`
    would count as two GPUs."""
    env = os.environ if environ is None else environ
    name, ids = _pool_source(env)
    if not name:
        return None
    given = f"{name}={env[name]}"
    unknown = [d for d in ids if not _ID.match(d)]
    if unknown:
        return (f"{given}: {', '.join(repr(d) for d in unknown)} is no GPU id; give device indexes as nvidia-smi "
                f"lists them (0,1,2,3) or their UUIDs (GPU-...)")
    twice = sorted({d for d in ids if ids.count(d) > 1})
    if twice:
        return f"{given} names GPU {', '.join(twice)} more than once; give each device once"
    return None


SHARE_OVER = 0.005  # how far k x share may exceed a whole GPU: 1/k written to three decimals (0.167 for 1/6)


def share_problem(gpu_share: float) -> str | None:
    """Why `gpu_share` does not divide a GPU among a whole number of jobs, or None.

    k = round(1/share) jobs share a GPU, each planning for `gpu_share` of it. A share for which those k
    jobs together plan for more than the GPU is refused, not rounded: rounding 1/share to the nearest
    count (as growlm did) over-commits the GPU (0.6 gave 2 jobs, 120% of its memory; 0.35 gave 3, 105%),
    and the last job runs out of memory hours in; rounding down instead (0.6 -> 1 job) would run a
    different experiment from the one asked for (one job per GPU where the user expected company) without
    a word. 1/k written to two or three decimals passes (0.33, 0.333, 0.167), and so does a share below
    1/k, which leaves headroom (0.45: 2 jobs, 90% of the GPU; 0.9: one job)."""
    k = max(1, round(1 / gpu_share))
    if k * gpu_share <= 1 + SHARE_OVER:
        return None
    return (f"resources.gpu_share = {gpu_share}: {k} jobs per GPU would plan for {k * gpu_share:.0%} of its memory; "
            f"give 1/k for k jobs per GPU, e.g. {1 / (k - 1):.3g} ({k - 1} job{'s' if k > 2 else ''}) or "
            f"{1 / k:.3g} ({k} jobs)")


def slots_per_gpu(gpu_share: float) -> int:
    """How many jobs share one GPU when each may plan for `gpu_share` of it (a share is
    refused when those jobs would plan for more than the GPU: `share_problem`)."""
    problem = share_problem(gpu_share)
    if problem:
        raise GrowlmError(problem)
    return max(1, round(1 / gpu_share))


def placed_by_scheduler(environ: dict | None = None) -> bool:
    """Whether a cluster executor submitted this job, so that the scheduler placed its GPUs (a job of a
    local run claims its own, inside a SLURM allocation too)."""
    return (os.environ if environ is None else environ).get(PLACED_ENV) == "scheduler"


def locks_dir() -> Path:
    path = Path(os.environ.get(LOCKS_ENV) or DEFAULT_LOCKS)
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        try:
            path.chmod(0o1777)  # every user's jobs share the machine's devices
        except OSError:
            pass
    return path


def device_keys(devices: list[str]) -> dict[str, str]:
    """What names each device's lock files: its UUID (as given, or as nvidia-smi maps its index), else its id."""
    uuids = dict(_smi()) if any(d.isdigit() for d in devices) else {}
    return {d: d if not d.isdigit() else (uuids.get(d) or d) for d in devices}


def _lock_file(key: str, slot: int = 0) -> Path:
    return locks_dir() / f"gpu-{re.sub(r'[^A-Za-z0-9_-]', '_', key)}.{slot}.lock"


def holders(key: str, slots: int = 1) -> str:
    """Who holds a device's slots, as the holders wrote it ("pid 123, rule train_small, /path/to/run")."""
    out = []
    for slot in range(slots):
        try:
            out.append(_lock_file(key, slot).read_text().strip())
        except OSError:
            pass
    return " | ".join(h for h in out if h)


def _open(path: Path) -> int:
    """The lock file open (created readable and writable by every user, whatever the umask)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file that is not writable: a shared lock is enough to test
        try:
            return os.open(path, os.O_RDONLY)
        except PermissionError:
            raise GrowlmError(f"the GPU lock file {path} belongs to another user and is not readable, so no job can "
                              f"tell whether its device is free; ask its owner (or root) to run `chmod 666 {path}`") \
                from None
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != 0o666:
            os.fchmod(fd, 0o666)  # the umask (077 on many sites) would keep other users' runs out
    except OSError:  # not ours to change
        pass
    return fd


def _try(key: str, slot: int) -> int | None:
    """An open lock file of a device's slot with its exclusive lock taken, or None when another process
    holds it."""
    fd = _open(_lock_file(key, slot))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _busy(key: str, slots: int) -> int:
    """How many of a device's slots other processes hold now."""
    held = 0
    for slot in range(slots):
        fd = _try(key, slot)
        if fd is None:
            held += 1
        else:
            os.close(fd)
    return held


@dataclass
class Claim:
    """The devices a job holds (ids as the machine names them), and the open lock files that hold them."""

    devices: list[str]
    fds: list[int] = field(default_factory=list)
    placed_by: str = "growlm"  # "growlm", "scheduler" or "none"

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


# A process that starts processes which do not inherit its open files hands them the lock files over a Unix
# socket instead (SCM_RIGHTS): torch's elastic agent starts its workers with close_fds, so a worker would
# otherwise hold none of the job's devices, and a worker that outlived its agent and job (kill -9 of the
# job's process group) would go on writing on devices already given to the next job. A descriptor passed
# this way is the same open file, so the worker holds the same lock, until it has ended.


def inherited() -> list[int]:
    """The lock files this process inherited from the job (`HELD_ENV`, set by `growlm.processes.start`) that are
    still open here, held as its own."""
    fds = []
    for text in os.environ.get(HELD_ENV, "").split(","):
        if text.strip().isdigit():
            try:
                os.fstat(int(text))
            except OSError:
                continue
            fds.append(int(text))
    _HELD.extend(fd for fd in fds if fd not in _HELD)
    return fds


def hand_on(fds: list[int]) -> str:
    """Serve `fds` to this process's workers: a Unix socket in the abstract namespace (nothing to clean up;
    it ends with this process) where a daemon thread gives every connecting process of this user a copy of
    them. Returns its name, for `HAND_ON_ENV`."""
    name = f"growlm-gpus-{os.getpid()}-{secrets.token_hex(6)}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(64)
    me = os.getuid()

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                      struct.calcsize("3i")))
                if uid == me:
                    socket.send_fds(conn, [b"L"], fds)

    threading.Thread(target=serve, name="growlm-gpu-locks", daemon=True).start()
    return name


def take_over(environ: dict | None = None) -> list[int]:
    """In a worker of a torchrun launch: take the job's lock files from its agent (`hand_on`; `HAND_ON_ENV`
    names the socket) and hold them until this process ends. Nothing when the agent hands none (a job
    that claimed no GPU). Raises GrowlmError when the agent does not answer: a worker that cannot hold the
    job's devices must not use them."""
    name = (os.environ if environ is None else environ).get(HAND_ON_ENV)
    if not name:
        return []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            conn.connect("\0" + name)
            _msg, fds, _flags, _addr = socket.recv_fds(conn, 16, 64)
    except OSError as err:
        raise GrowlmError(f"could not take over the job's GPU locks from its torchrun agent ({err}); the agent "
                          "has ended, or this process was not started by it") from None
    _HELD.extend(fds)
    return fds


def _take(key: str, slots: int) -> int | None:
    """A free slot of a device, taken (its open lock file), or None when all are held."""
    for slot in range(slots):
        fd = _try(key, slot)
        if fd is not None:
            return fd
    return None


@contextlib.contextmanager
def _claiming():
    """The machine's claim lock (`claim.lock` in the locks folder), held while one claim ranks the devices
    by how busy they are and takes its slots. Without it two claims started together rank the same free
    device first and both take a slot of it (measured: 2 claims on 4 fake devices with 2 slots each landed
    on one device 3 times in 15) while other devices stay free. It is held for a few milliseconds, never
    while a job waits for devices, and released by the kernel if the claiming process dies."""
    fd = _open(locks_dir() / "claim.lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claim(count: int, *, who: str = "", log=print, slots: int | None = None,
          say_every_s: float = SAY_EVERY_S) -> Claim:
    """Claim `count` devices of this machine for this process (a slot on each: `slots` per device, default
    $GROWLM_GPU_SLOTS or 1; the least busy devices first) and set CUDA_VISIBLE_DEVICES to them (see the
    module docstring); wait while fewer are free. For a job a cluster executor submitted, or when the job
    asks for none or the machine has none, nothing is claimed and CUDA_VISIBLE_DEVICES is left as it is."""
    if count <= 0:
        return Claim([], placed_by="none")
    os.environ.update(DEVICE_ORDER)
    if placed_by_scheduler():
        devices = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        log(f"GPUs placed by the scheduler: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
        return Claim(devices, placed_by="scheduler")
    problem = pool_problem()
    if problem:
        raise GrowlmError(problem)
    pool = machine_gpus()
    if not pool:
        log(f"asks for {count} GPU{'s' if count > 1 else ''}; this machine has none: the job runs on the CPU")
        return Claim([], placed_by="none")
    if count > len(pool):
        log(f"asks for {count} GPUs; this machine has {len(pool)} ({','.join(pool)}): it takes all of them")
        count = len(pool)
    slots = slots or int(os.environ.get(SLOTS_ENV, "1") or 1)
    keys = device_keys(pool)
    stamp = f"pid {os.getpid()}, {who or 'a growlm job'}, {os.getcwd()}"
    start = said = time.monotonic()
    first = True
    while True:
        with _claiming():  # ranking the devices and taking slots, one claim at a time on this machine
            got: list[tuple[str, int]] = []
            order = sorted(pool, key=lambda d: _busy(keys[d], slots)) if slots > 1 else pool  # a free GPU first
            for device in order:
                fd = _take(keys[device], slots)
                if fd is not None:
                    got.append((device, fd))
                    if len(got) == count:
                        break
            if len(got) < count:
                for _, fd in got:
                    os.close(fd)
        if len(got) == count:
            break
        now = time.monotonic()
        if first or now - said >= say_every_s:
            busy = "; ".join(f"{d}: {holders(keys[d], slots) or 'held'}" for d in pool
                             if d not in {g for g, _ in got})
            log(f"waiting for {count} free GPU{'s' if count > 1 else ''} of {','.join(pool)} "
                f"({now - start:.0f} s so far); held: {busy}")
            said, first = now, False
        time.sleep(0.5)
    got.sort(key=lambda g: pool.index(g[0]))
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
