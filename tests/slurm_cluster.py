"""A throw-away two-node SLURM cluster on localhost, for integration tests.

``start_cluster(workdir)`` installs ``slurm-wlm`` and ``munge`` from Debian if they are missing
(root only), starts ``munged``, writes ``/etc/slurm/slurm.conf`` and ``gres.conf`` for this host
(two nodes, each with all its cores, ~80 % of its memory and one fake GPU ``Gres=gpu:1`` backed by
``File=/dev/null`` so ``--gpus=1`` jobs schedule and see ``CUDA_VISIBLE_DEVICES=0``), starts
``slurmctld`` and one ``slurmd`` per node and waits until the nodes are ``idle``.
``stop_cluster(info)`` cancels the jobs of a cluster it started and kills exactly the daemons that
``start_cluster`` started (by pid); daemons that were already running are left alone, so both calls
are idempotent.

The two nodes are two ``slurmd`` on this one host: Debian's SLURM is built with multiple-slurmd
support (``scontrol show config``: ``MULTIPLE_SLURMD = Yes``), so each is started as ``slurmd -N
<node>`` with a port, spool folder, pid file and log of its own (``%n`` in the config). The first node
is named after the host, the second ``<host>b``; both have the address 127.0.0.1. Jobs of growlm's
SLURM profile run ``srun`` inside their allocation without ``SLURM_CONF`` (the plugin's job step
removes it), so the config must be at the default place, ``/etc/slurm/slurm.conf``.

Anything that makes a cluster impossible (not root, apt fails, a foreign slurm.conf, a daemon
that will not start) raises ``ClusterUnavailable`` with the reason, for ``pytest.skip(reason)``.

Three partitions: ``debug`` (default, the first node only, PriorityTier 1), ``urgent`` (the first
node, PriorityTier 2, for tests only) and ``multi`` (both nodes, for jobs across nodes). ``PreemptType=preempt/partition_prio`` + ``PreemptMode=REQUEUE``: a job in ``urgent``
preempts a ``debug`` job, which gets SIGCONT+SIGTERM, ``KillWait`` seconds, SIGKILL, and is
requeued -- what a preemptible partition on a real site does. (Measured with SLURM 22.05: with a
partition ``GraceTime`` > 0 a job whose process exits on SIGTERM within the grace time ends
FAILED instead of being requeued; Snakemake's retry then resumes it. GraceTime is 0 here.) ``MinJobAge=600`` keeps finished jobs visible
to ``squeue`` (the Snakemake plugin's status command here: there is no slurmdbd, so no sacct).

Set ``GROWLM_SLURM_INSTALL=0`` to forbid the apt-get install (the tests then skip if SLURM is
missing). ``run_snakemake_on_cluster()`` runs a workflow through ``profiles/slurm-local``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLURM_LOCAL_PROFILE = REPO / "profiles" / "slurm-local"

CONF_DIR = Path("/etc/slurm")
SLURM_CONF = CONF_DIR / "slurm.conf"
GRES_CONF = CONF_DIR / "gres.conf"
MARKER = "# written by growlm tests/slurm_cluster.py"
LOG_DIR = Path("/var/log/slurm")
STATE_DIR = Path("/var/lib/slurm")
CTLD_PID = Path("/run/slurmctld.pid")
SLURMD_PORTS = (6818, 6819)  # one slurmd per node, each on its own port
MUNGE_RUN = Path("/run/munge")
MUNGE_PID = MUNGE_RUN / "munged.pid"

PARTITION = "debug"
URGENT_PARTITION = "urgent"
MULTI_PARTITION = "multi"
# A requeued job waits `cred_expire` seconds before it may start again (default 120).
REQUEUE_DELAY_S = 10


class ClusterUnavailable(RuntimeError):
    """No local SLURM cluster can be had here; the message says why."""


def node_names(host: str) -> list[str]:
    """The cluster's nodes: the first named after the host, the second `<host>b`."""
    return [host, f"{host}b"]


def slurmd_pidfile(node: str) -> Path:
    return Path(f"/run/slurmd-{node}.pid")


@dataclass
class ClusterInfo:
    host: str
    partition: str = PARTITION
    urgent_partition: str = URGENT_PARTITION
    multi_partition: str = MULTI_PARTITION
    cpus: int = 1
    mem_mb: int = 0
    conf: Path = SLURM_CONF
    log_dir: Path = LOG_DIR
    started: dict[str, int] = field(default_factory=dict)  # daemon name -> pid we started
    installed: bool = False  # apt-get install ran in this call
    setup_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ctld_log(self) -> Path:
        return self.log_dir / "slurmctld.log"

    @property
    def nodes(self) -> list[str]:
        return node_names(self.host)

    def slurmd_log(self, node: str) -> Path:
        return self.log_dir / f"slurmd-{node}.log"


def cluster_env() -> dict:
    """The environment of a process that talks to the test cluster: this one's without SLURM_CONF (which
    tests/conftest.py points at a controller that answers at once that it is not there), so that SLURM's
    commands read the cluster's own /etc/slurm/slurm.conf, as its jobs' steps do (they get no SLURM_CONF)."""
    return {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}


def _run(cmd, timeout=60, check=False, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("env", cluster_env())
    return subprocess.run(
        cmd,
        shell=isinstance(cmd, str),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        **kw,
    )


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"(no {path})"


def _have_binaries() -> bool:
    return all(
        shutil.which(b) or Path("/usr/sbin", b).exists()
        for b in ("sbatch", "squeue", "sinfo", "scontrol", "slurmctld", "slurmd", "munged")
    )


def _install() -> None:
    if os.geteuid() != 0:
        raise ClusterUnavailable("SLURM is not installed and we are not root (cannot apt-get install)")
    if os.environ.get("GROWLM_SLURM_INSTALL", "1") == "0":
        raise ClusterUnavailable("SLURM is not installed and GROWLM_SLURM_INSTALL=0 forbids installing it")
    if not shutil.which("apt-get"):
        raise ClusterUnavailable("SLURM is not installed and there is no apt-get")
    from apt_lock import apt_install

    try:
        p = apt_install("slurm-wlm", "munge")
    except subprocess.TimeoutExpired as e:
        raise ClusterUnavailable(f"apt-get timed out: {e}") from e
    if p.returncode != 0:
        raise ClusterUnavailable(f"apt-get install slurm-wlm munge failed:\n{p.stdout[-1500:]}{p.stderr[-1500:]}")
    if not _have_binaries():
        raise ClusterUnavailable("apt-get install succeeded but SLURM binaries are still missing")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _pid_alive(pid) else None


def _proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _daemon_pid(pidfile: Path, name: str) -> int | None:
    """Pid of a running daemon `name` from its pidfile (None if not running)."""
    pid = _read_pid(pidfile)
    return pid if pid is not None and _proc_name(pid) == name else None


def _munge_ok() -> bool:
    # without a daemon `munge -n` retries for ~9 s before failing; look for one first
    if _daemon_pid(MUNGE_PID, "munged") is None and not Path(MUNGE_RUN, "munge.socket.2").exists():
        return False
    try:
        p = _run("munge -n | unmunge", timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return p.returncode == 0 and "Success" in p.stdout


def _wait(pred, timeout: float, step: float = 0.2) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def _start_munge(info: ClusterInfo) -> None:
    if _munge_ok():
        return
    if not Path("/etc/munge/munge.key").exists():
        raise ClusterUnavailable("/etc/munge/munge.key is missing (munge package broken?)")
    MUNGE_RUN.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_RUN, "munge", "munge")
    p = _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], timeout=20)
    if p.returncode != 0:
        raise ClusterUnavailable(f"munged did not start: {p.stdout}{p.stderr}")
    if not _wait(_munge_ok, 10):
        raise ClusterUnavailable("munged started but `munge -n | unmunge` fails")
    pid = _daemon_pid(MUNGE_PID, "munged")
    if pid:
        info.started["munged"] = pid


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


def slurm_conf_text(host: str, cpus: int, mem_mb: int) -> str:
    first, second = node_names(host)
    return f"""{MARKER}
# Two nodes on 127.0.0.1 (two slurmd on this host) for integration tests; overwritten at each start.
ClusterName=localtest
SlurmctldHost={host}(127.0.0.1)
AuthType=auth/munge
# a requeued (preempted) job may start again after this many seconds (default 120)
AuthInfo=cred_expire={REQUEUE_DELAY_S}
SlurmUser=slurm
StateSaveLocation={STATE_DIR}/slurmctld
SlurmdSpoolDir={STATE_DIR}/slurmd-%n
SlurmctldPidFile={CTLD_PID}
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile={LOG_DIR}/slurmctld.log
SlurmdLogFile={LOG_DIR}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
# squeue must still see finished jobs when the plugin polls (it backs off up to 180 s)
MinJobAge=600
# seconds between SIGTERM and SIGKILL on scancel / time limit
KillWait=10
MpiDefault=none
GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName={first} NodeHostname={host} NodeAddr=127.0.0.1 Port={SLURMD_PORTS[0]} CPUs={cpus} RealMemory={mem_mb} Gres=gpu:1 State=UNKNOWN
NodeName={second} NodeHostname={host} NodeAddr=127.0.0.1 Port={SLURMD_PORTS[1]} CPUs={cpus} RealMemory={mem_mb} Gres=gpu:1 State=UNKNOWN
PartitionName={PARTITION} Nodes={first} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName={URGENT_PARTITION} Nodes={first} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
PartitionName={MULTI_PARTITION} Nodes={first},{second} MaxTime=INFINITE State=UP PriorityTier=1
"""


def _write_conf(info: ClusterInfo) -> None:
    if SLURM_CONF.exists() and MARKER not in SLURM_CONF.read_text(errors="replace"):
        raise ClusterUnavailable(f"{SLURM_CONF} exists and was not written by this helper; not touching it")
    CONF_DIR.mkdir(parents=True, exist_ok=True)
    SLURM_CONF.write_text(slurm_conf_text(info.host, info.cpus, info.mem_mb))
    GRES_CONF.write_text(f"{MARKER}\n# fake GPU: a File= is needed or slurmd reports 0 GPUs and the node drains\n"
                         f"NodeName={','.join(info.nodes)} Name=gpu File=/dev/null\n")
    for d in (STATE_DIR / "slurmctld", *(STATE_DIR / f"slurmd-{n}" for n in info.nodes), LOG_DIR):
        d.mkdir(parents=True, exist_ok=True)
    shutil.chown(STATE_DIR / "slurmctld", "slurm", "slurm")
    shutil.chown(LOG_DIR, "slurm", "slurm")


def _node_state(host: str) -> str:
    try:
        p = _run(["sinfo", "-h", "-N", "-n", host, "-o", "%T"], timeout=10)
    except subprocess.TimeoutExpired:
        return ""
    return p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else ""


def _ctld_responds() -> bool:
    try:
        return _run(["scontrol", "ping"], timeout=10).stdout.count("UP") > 0
    except subprocess.TimeoutExpired:
        return False


def _usable(state: str) -> bool:
    return state.lower().rstrip("*~#$@^-+") in {"idle", "mixed", "allocated", "completing"}


def _cluster_ready(host: str) -> bool:
    """Our two-node config is in place and both nodes are usable (idle, mixed or allocated)."""
    if not (SLURM_CONF.exists() and MARKER in SLURM_CONF.read_text(errors="replace")):
        return False
    if f"NodeName={node_names(host)[1]} " not in SLURM_CONF.read_text(errors="replace"):
        return False  # an older one-node config
    # with no controller, sinfo retries for ~10 s before it fails; look for the daemons first
    if _daemon_pid(CTLD_PID, "slurmctld") is None:
        return False
    if any(_daemon_pid(slurmd_pidfile(n), "slurmd") is None for n in node_names(host)):
        return False
    return all(_usable(_node_state(n)) for n in node_names(host))


def start_cluster(workdir: str | os.PathLike | None = None) -> ClusterInfo:
    """Start (or find) the localhost cluster; raise ClusterUnavailable with the reason if impossible.

    `workdir` receives `cluster-setup.log` (what was done and how long it took)."""
    t0 = time.monotonic()
    info = ClusterInfo(host=socket.gethostname().split(".")[0], cpus=os.cpu_count() or 1)
    info.mem_mb = max(256, int(_mem_mb() * 0.8))
    if sys.platform != "linux":
        raise ClusterUnavailable("the local SLURM cluster needs Linux")
    if not _have_binaries():
        _install()
        info.installed = True
        info.notes.append("installed slurm-wlm and munge with apt-get")

    if _cluster_ready(info.host) and _munge_ok():
        info.notes.append("cluster already up; nothing started")
        return _finish(info, workdir, t0)
    if os.geteuid() != 0:
        raise ClusterUnavailable("no running local SLURM cluster and not root (cannot start the daemons)")

    def mark(what):
        info.notes.append(f"{time.monotonic() - t0:6.2f} s  {what}")

    try:
        _start_munge(info)
        mark("munged ok")
        ctld = _daemon_pid(CTLD_PID, "slurmctld")
        slurmds = {n: _daemon_pid(slurmd_pidfile(n), "slurmd") for n in info.nodes}
        if ctld is not None and f"NodeName={info.nodes[1]} " not in SLURM_CONF.read_text(errors="replace"):
            raise ClusterUnavailable(f"a slurmctld (pid {ctld}) runs with an older one-node config; stop it first")
        if ctld is None or None in slurmds.values():
            # (re)write the config only while at least one daemon is down; running daemons keep it
            _write_conf(info)
        if ctld is None:
            # -c: clear saved state (jobs, node states) from a previous test session
            p = _run(["/usr/sbin/slurmctld", "-c"], timeout=30)
            if p.returncode != 0:
                raise ClusterUnavailable(f"slurmctld did not start: {p.stderr.strip()}\n{_tail(info.ctld_log)}")
            if not _wait(lambda: _daemon_pid(CTLD_PID, "slurmctld") is not None, 10):
                raise ClusterUnavailable(f"slurmctld exited at start:\n{_tail(info.ctld_log)}")
            info.started["slurmctld"] = _daemon_pid(CTLD_PID, "slurmctld")
        if not _wait(_ctld_responds, 20):
            raise ClusterUnavailable(f"slurmctld does not answer `scontrol ping`:\n{_tail(info.ctld_log)}")
        mark("slurmctld answers")
        for node, pid in slurmds.items():
            if pid is not None:
                continue
            pidfile = slurmd_pidfile(node)
            p = _run(["/usr/sbin/slurmd", "-N", node], timeout=30)
            if p.returncode != 0:
                raise ClusterUnavailable(f"slurmd -N {node} did not start: {p.stderr.strip()}\n"
                                         f"{_tail(info.slurmd_log(node))}")
            if not _wait(lambda: _daemon_pid(pidfile, "slurmd") is not None, 10):
                raise ClusterUnavailable(f"slurmd -N {node} exited at start:\n{_tail(info.slurmd_log(node))}")
            info.started[f"slurmd {node}"] = _daemon_pid(pidfile, "slurmd")
            mark(f"slurmd -N {node} started")

        end = time.monotonic() + 40
        resumed = set()
        while not _cluster_ready(info.host):
            states = {n: _node_state(n).lower() for n in info.nodes}
            for node, state in states.items():
                if node not in resumed and any(s in state for s in ("drain", "down", "fail")):
                    _run(["scontrol", "update", f"nodename={node}", "state=resume"], timeout=10)
                    info.notes.append(f"node {node} was {state!r}; resumed it")
                    resumed.add(node)
            if time.monotonic() > end:
                reason = _run(["sinfo", "-R"], timeout=10).stdout
                logs = "\n".join(_tail(info.slurmd_log(n)) for n in info.nodes)
                raise ClusterUnavailable(f"nodes not idle after 40 s (states {states}):\n{reason}\n{logs}")
            time.sleep(0.3)
        mark("nodes " + ", ".join(f"{n} {_node_state(n)}" for n in info.nodes))
    except ClusterUnavailable:
        stop_cluster(info)
        raise
    except (OSError, subprocess.SubprocessError, KeyError, LookupError) as e:
        stop_cluster(info)
        raise ClusterUnavailable(f"{type(e).__name__}: {e}") from e
    return _finish(info, workdir, t0)


def _finish(info: ClusterInfo, workdir, t0: float) -> ClusterInfo:
    info.setup_s = time.monotonic() - t0
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        (Path(workdir) / "cluster-setup.log").write_text(
            f"host={info.host} cpus={info.cpus} mem_mb={info.mem_mb} setup_s={info.setup_s:.1f}\n"
            f"started={info.started}\n" + "\n".join(info.notes) + "\n"
        )
    return info


def stop_cluster(info: ClusterInfo, timeout: float = 20) -> None:
    """Kill the daemons that start_cluster started (and only those); cancel jobs first if the
    controller is ours. Safe to call twice."""
    if "slurmctld" in info.started:
        try:
            # the cluster is ours, so are its jobs; their slurmstepd processes go with them
            partitions = ",".join((info.partition, info.urgent_partition, info.multi_partition))
            _run(["scancel", "--full", "--quiet", f"--partition={partitions}"], timeout=10)
            _wait(lambda: not _run(["squeue", "-h", "-t", "running,completing"], timeout=10).stdout.strip(), 15, 0.5)
        except (OSError, subprocess.SubprocessError):
            pass
    for name in (*(f"slurmd {n}" for n in info.nodes), "slurmctld", "munged"):
        pid = info.started.get(name)
        if pid is None or not _pid_alive(pid) or _proc_name(pid) != name.split()[0]:
            info.started.pop(name, None)
            continue
        os.kill(pid, signal.SIGTERM)
        if not _wait(lambda: not _pid_alive(pid), timeout):
            os.kill(pid, signal.SIGKILL)
            _wait(lambda: not _pid_alive(pid), 5)
        info.started.pop(name, None)


def snakemake_command(
    workdir, snakefile, configfiles=(), extra_args=(), profile=SLURM_LOCAL_PROFILE
) -> list[str]:
    """`python -m snakemake --profile <profile> ...` for the venv running the tests, through
    tests/slurm_snakemake.py (its status checks a few seconds apart, not backing off to minutes)."""
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "slurm_snakemake.py"), "--profile", str(profile),
           "--snakefile", str(snakefile), "--directory", str(workdir), *map(str, extra_args)]
    if configfiles:  # last: `--configfiles` takes every following word (targets included)
        cmd += ["--configfiles", *map(str, configfiles)]
    return cmd


def run_snakemake_on_cluster(
    workdir, snakefile, configfiles=(), extra_args=(), profile=SLURM_LOCAL_PROFILE, timeout=600
) -> subprocess.CompletedProcess:
    """Run a workflow through the SLURM profile (default `profiles/slurm-local`) and wait.

    stdout and stderr are captured (text, merged into .stdout); add `--verbose` to `extra_args`
    to see the sbatch lines. The SLURM logs stay under `<workdir>/.snakemake/slurm_logs/`."""
    env = cluster_env()
    # the venv's bin on PATH, so jobs that call `python` (and the jobstep's srun) find it
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run(
        snakemake_command(workdir, snakefile, configfiles, extra_args, profile),
        cwd=str(workdir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=timeout, env=env,
    )


def popen_snakemake_on_cluster(
    workdir, snakefile, configfiles=(), extra_args=(), profile=SLURM_LOCAL_PROFILE, log=None
) -> subprocess.Popen:
    """Like run_snakemake_on_cluster but returns at once (output to `log`, a path)."""
    env = cluster_env()
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    out = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen(
        snakemake_command(workdir, snakefile, configfiles, extra_args, profile),
        cwd=str(workdir), stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
    )


if __name__ == "__main__":  # manual use: python tests/slurm_cluster.py  (leaves it running)
    print(start_cluster("."))
