"""How a job gets its devices and processes: the one place that says it; the rules, the entry scripts, the
training jobs and the runner ask here.

- **What a job asks for** (`training_resources`, `one_process_gpus`: what the rules declare; `job_launch`,
  `gpus_per_node`, `job_gpus`, `run_options`: what a job reads of them): its rule's resources - `gpu`
  GPUs on one node, or `nodes` nodes with `gres: gpu[:type]:G` GPUs on each and `cpus_per_task` CPUs -
  and how many processes that makes on each node (`processes_for`). `resource_problems` checks the
  resources of every rule (the config's and `--set-resources`) while the Snakefile is read, before the
  first job and in a dry run too.
- **Its devices** (`job_devices`): a job of a local run claims its own GPUs on this machine
  (`growlm.gpus`), also inside a SLURM allocation; a job a cluster executor submitted has the ones the
  scheduler gave it. `run_environment` is what the Snakefile exports to the run's jobs for that, from
  Snakemake's executor (`snakemake_executor`: Snakemake's own parse of its command line, profiles applied,
  while the Snakefile is read; the executor it runs the jobs with once that is set).
- **Its nodes and ports**: the SLURM allocation of a job across nodes (`job_allocation`), its rendezvous
  endpoint (`rendezvous_endpoint`, `free_port`), and the loopback rendezvous of a process group of one
  (`world_of_one`).
- **Its processes** (`growlm.processes.run_processes`): one (the job's own), torchrun on this machine
  (`standalone_command`), or one torchrun agent per node of its SLURM allocation (`node_command`). Both
  launches go through `growlm.node_agent`, which names itself to its workers so that they stop with it.

Every process a job starts ends with the job and holds the job's devices until it has ended:
- it inherits the open lock files of the job's GPUs (`pass_fds`) and gets SIGTERM when its parent dies,
  and stops at once if that parent is gone before it could ask for the signal: a small exec wrapper
  (`growlm.processes.WITH_PARENT`) asks for the signal in the new process and execs the command, instead of a preexec_fn
  in the job, which has threads; torch's elastic agent starts its workers in sessions of their own and
  does not pass them open files, so each worker asks for the signal itself and watches its agent
  (`growlm.errors.stop_with_parent`), and takes the lock files over from its agent
  (`growlm.gpus.take_over`), so that a worker outliving its agent and its job still holds the devices;
- the job becomes a subreaper (PR_SET_CHILD_SUBREAPER): a worker whose agent was killed becomes the
  job's child, not init's, and the job waits for every such process (SIGTERM, then SIGKILL after a
  grace time) before it returns - so the job's locks outlive them all;
- a SIGTERM to the job (its Snakemake died, SLURM's time limit) goes on to the launch, and the job
  waits for it to stop (a training process writes its checkpoint first).

Across N nodes (`resources.nodes` > 1) the job runs inside one SLURM allocation of N nodes, as
torchtitan's multi-node script and most SLURM sites do it: the job's own process, on the allocation's
first node, starts one task per node with srun, and each task runs one torchrun agent; the agents meet
at a c10d rendezvous on the first node:

    srun --nodes=N --ntasks=N --ntasks-per-node=1 --cpus-per-task=C --kill-on-bad-exit=1 [--gres=gpu:P]
         python -m growlm.node_agent --nnodes N --nproc-per-node P --endpoint ADDR:PORT --rdzv-id JOB JOB.json

- the allocation is asked of SLURM itself (`slurm_allocation`): the SLURM executor plugin's job step
  removes SLURM_JOB_NODELIST, SLURM_NNODES and SLURM_CONF from the job's environment;
- the endpoint is the first node's address as SLURM has it (its NodeAddr), passed on as a name for the
  other nodes to resolve, as torchtitan and Lightning do: on the first node Debian and Ubuntu map the
  host's own name to 127.0.1.1, which says nothing of what the others reach. Only an address that is
  loopback whatever resolves it (127.0.0.1, localhost) while the nodes are other hosts stops the job;
- the port is one free on the first node a moment before; if something took it meanwhile, torch's own
  bind of it fails (EADDRINUSE), the first node's agent says so (`--port-taken`) and the launch starts
  again on another port, up to `RENDEZVOUS_TRIES` times, instead of spending the job's retry;
- the first node's agent hosts the rendezvous store (`is_host`), the others connect to it;
- `--cpus-per-task` is given (else each task gets one CPU); `--kill-on-bad-exit=1` and torchrun's
  `--max-restarts=0` end the whole job when one process fails, so the retried job resumes from its last
  checkpoint instead of half a world waiting in a collective;
- the environment goes with the tasks (srun's `--export=ALL`), the network interface variables
  included (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); each agent (`--srun-task`) drops what names a process
  or a descriptor of the launching node ($GROWLM_PARENT_PID, the GPU locks' descriptors): on its node that is
  another process or file, and an agent that watched it would stop at once. SLURM ends the step's tasks with
  the step.

Rank 0 may be on any node: everything it writes is in the working folder, which the nodes share.
Torch-free (the Snakefile imports it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from growlm import gpus
from growlm.console import log as job_log
from growlm.errors import PARENT_ENV, GrowlmError
from growlm.processes import run_processes

INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
NPROC_ENV = "GROWLM_NPROC"  # processes per node whatever the GPUs (e.g. 2 gloo processes on a CPU, for tests)
RENDEZVOUS_TRIES = 3
PORT_TAKEN_EXIT = 75  # a node agent's exit status when the rendezvous port was taken (EX_TEMPFAIL)

# ----------------------------------------------------------------------------------------------
# what a job asks for
# ----------------------------------------------------------------------------------------------


def _get(resources, name: str, default=None):
    if isinstance(resources, dict):
        return resources.get(name, default)
    return getattr(resources, name, default)


def gpus_per_node(resources) -> int:
    """The GPUs a job has on each of its nodes: the count in its `gres` (SLURM's `gpu[:type][:count]`, per
    node; no count is one) where it has one, else its `gpu` resource."""
    gres = str(_get(resources, "gres", "") or "").strip("'\"")  # quoted as given on the command line
    if gres:
        parts = gres.split(":")
        if parts[0] != "gpu" or len(parts) > 3 or any(not p for p in parts):
            raise GrowlmError(f"gres {gres!r}: growlm reads GPUs as gpu, gpu:COUNT or gpu:TYPE:COUNT (SLURM's form)")
        count = parts[-1] if len(parts) > 1 and parts[-1].isdigit() else "1"
        if len(parts) == 3 and not parts[2].isdigit():
            raise GrowlmError(f"gres {gres!r}: the count after the type must be a number (gpu:TYPE:COUNT)")
        return int(count)
    return int(_get(resources, "gpu", 0) or 0)


def job_gpus(resources) -> int:
    """The GPUs a job claims on this machine: its `gpu` resource (a job across nodes has `gres` instead,
    and SLURM places those)."""
    return int(_get(resources, "gpu", 0) or 0)


def resource_problems(rules: dict, executor: str | None) -> list[str]:
    """What is wrong with the resources of the rules (`{rule: {name: value}}`, the values as Snakemake
    resolved them: the config's, a profile's and `--set-resources`), each as one line: a count that is
    no whole number or below its least, a `gres` growlm cannot read, nodes > 1 with an executor other
    than SLURM (`executor`: Snakemake's, None when not known). Values that Snakemake computes per job
    (functions) are checked by their job."""
    problems = []
    for rule, res in sorted(rules.items()):
        for name, least in (("gpu", 0), ("nodes", 1), ("cpus_per_task", 0)):
            value = res.get(name)
            if value is None or callable(value):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                problems.append(f"rule {rule}: resources {name}={value!r}: a whole number of at least {least}")
            elif name == "nodes" and value > 1 and executor not in (None, "slurm"):
                problems.append(f"rule {rule}: resources nodes={value}: a job across several nodes runs through "
                                f"SLURM (--profile profiles/slurm), and this run uses Snakemake's {executor} executor")
        if isinstance(res.get("gres"), str):
            try:
                gpus_per_node(res)
                if not callable(res.get("gpu")) and not callable(res.get("nodes")):
                    job_launch(res)
            except GrowlmError as err:
                problems.append(f"rule {rule}: resources {err}")
    return problems


def training_resources(res: dict, train_threads: int) -> dict:
    """The resources every training rule asks for, from the config's `resources` section (`res`) and its
    training threads; `mem_mb` and `runtime` scaled by the attempt on retries.

    On one node: `gpu` GPUs (SLURM's --gpus; locally the job claims that many devices of its own,
    growlm.gpus) and `cpus_per_gpu` CPUs each. Across `nodes` > 1 nodes (SLURM only): one task per node
    (`tasks`, with `mpi`, so that the SLURM plugin starts the job once, on the first node, and the job
    starts the tasks with srun), `gres: gpu:G` GPUs on every node instead of `gpu` (which would count
    them for the whole job), `cpus_per_task` CPUs on every node (G x cpus_per_gpu, or the training
    threads on CPU nodes; without it each task gets one CPU) and `tasks_per_gpu: 0` (else the plugin asks
    for a task per GPU). `mem_mb` is then per node. The processes each node starts follow from the same
    numbers (`job_launch`)."""
    scaled = dict(mem_mb=lambda wc, attempt: res["mem_mb"] * attempt,
                  runtime=lambda wc, attempt: res["runtime"] * attempt)
    if res["nodes"] == 1:
        return dict(gpu=res["gpu"], cpus_per_gpu=res["cpus_per_gpu"], **scaled)
    cpus = res["gpu"] * res["cpus_per_gpu"] if res["gpu"] else train_threads
    across = dict(nodes=res["nodes"], tasks=res["nodes"], tasks_per_gpu=0, mpi="srun", cpus_per_task=cpus, **scaled)
    if res["gpu"]:
        across["gres"] = f"gpu:{res['gpu']}"
    return across


def one_process_gpus(res: dict) -> int:
    """The GPUs a job that runs in one process claims (an evaluation, a profiled workload, a schedule's grow
    job): one when the training jobs ask for any, else none. More would be devices no process of it uses,
    kept from the jobs that would."""
    return min(1, int(res["gpu"]))


def job_launch(resources) -> dict:
    """How a training job runs on the resources Snakemake gave it: its GPUs on each node (`gpus`, the
    processes each node starts when that many are visible), its `nodes` and the CPUs of each node's task
    (`cpus_per_task`). Raises GrowlmError when `gpu` and `gres` say different counts on one node (the job
    would claim one number of devices and start another number of processes)."""
    nodes = int(_get(resources, "nodes", 1) or 1)
    per_node = gpus_per_node(resources)
    if nodes == 1 and _get(resources, "gres") and job_gpus(resources) not in (0, per_node):
        raise GrowlmError(f"gpu={job_gpus(resources)} and gres={_get(resources, 'gres')!r} disagree on one "
                          "node: give one of them")
    return {"gpus": per_node, "nodes": nodes, "cpus_per_task": int(_get(resources, "cpus_per_task", 0) or 0)}


def processes_for(gpus_asked: int) -> int:
    """Processes to start on each node: the GPUs a training job asks for there when that many are visible
    (else one, saying so); $GROWLM_NPROC overrides."""
    if os.environ.get(NPROC_ENV):
        return int(os.environ[NPROC_ENV])
    import torch  # here, not at the top: the Snakefile imports this module, and its parse loads no torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus_asked > 1 and have < gpus_asked:
        job_log(f"{gpus_asked} GPUs asked for but {have} visible: training in one process")
    return gpus_asked if gpus_asked > 1 and have >= gpus_asked else 1


def run_options(gpus_asked: int, nodes: int, cpus_per_task: int) -> dict:
    """`growlm.runner.run_job`'s keyword arguments for a job that asks for `gpus_asked` GPUs on each of
    `nodes` nodes."""
    return {"nproc": processes_for(gpus_asked), "nodes": int(nodes), "cpus_per_task": int(cpus_per_task),
            "gpus_per_node": int(gpus_asked)}


# ----------------------------------------------------------------------------------------------
# its devices
# ----------------------------------------------------------------------------------------------


PSEUDO_EXECUTORS = ("dryrun", "touch")  # Snakemake's stand-ins for -n and --touch, not who runs the jobs


def is_snakemake_command(argv: list[str]) -> bool:
    """Whether `argv` is Snakemake's own command line (`snakemake ...`, `python -m snakemake ...`), not another
    program that runs Snakemake through its Python API."""
    first = Path(argv[0]) if argv else Path()
    return first.name == "snakemake" or (first.name == "__main__.py" and first.parent.name == "snakemake")


def snakemake_executor(workflow, argv: list[str]) -> str | None:
    """The executor that runs this workflow's jobs ("local", "slurm", ...; a dry run or --touch names the one
    it plans for), or None when it is not known.

    Snakemake reads the Snakefile before it chooses the executor (`workflow.executor_plugin` is set by
    `Workflow.execute`, after the parse), and a dry run then holds its stand-in ("dryrun"), not the executor
    the run plans for. So, in this order: the executor Snakemake runs the jobs with, once it is set and is
    not a stand-in; else the command line Snakemake was started with (`argv`), parsed by Snakemake's own
    `snakemake.cli.parse_args`, its profiles applied as the run applies them (`--profile profiles/slurm`
    gives "slurm"; no --executor is "local"), read from the folder the Snakefile is read in, which is the
    run's working folder; else (a program running Snakemake through its Python API, while the Snakefile
    is read) None. What Snakemake prints of its profiles while it parses is not printed again."""
    plugin = getattr(workflow, "executor_plugin", None)
    if plugin is not None and plugin.name not in PSEUDO_EXECUTORS:
        return plugin.name
    if not is_snakemake_command(argv):
        return None
    from snakemake.cli import parse_args  # keeps snakemake.cli (0.8 CPU s) out of the jobs that import launch

    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        try:
            _parser, args = parse_args(list(argv[1:]))
        except (Exception, SystemExit):  # Snakemake itself says what is wrong with its command line
            return None
    return args.executor or "local"


def run_environment(executor: str | None, main_process: bool) -> dict:
    """What the Snakefile puts into the environment its jobs inherit: who places their GPUs (growlm in a
    local run, inside a SLURM allocation too; the scheduler for a job a cluster executor submitted),
    CUDA's device order (an index means what nvidia-smi shows), and, for a local run's jobs, the
    Snakemake process whose death must stop them (None: remove it, as in a cluster job, whose parent is
    SLURM's step daemon; a local run's own job steps leave their run's in place). A job step keeps who
    places its GPUs as its run decided: inside a SLURM job the rule runs under a local Snakemake."""
    local = executor in (None, "local")
    out = dict(gpus.DEVICE_ORDER)
    # the user's run decides; a job step (a SLURM job's Snakemake, and the local Snakemake it runs the rule
    # with) keeps what its run decided
    if main_process or gpus.PLACED_ENV not in os.environ:
        out[gpus.PLACED_ENV] = "growlm" if local else "scheduler"
    if not local or main_process:  # a local run's own job steps (Snakemake's subprocesses) keep their run's
        out[PARENT_ENV] = str(os.getpid()) if local else None
    return out


def nvidia_driver() -> str:
    """What says this machine has an NVIDIA driver: `nvidia-smi` reporting a CUDA version (as setup.sh reads
    it), or the kernel module's GPUs; empty without one. Torch-free."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        if m := re.search(r"CUDA Version: *(\d+\.\d+)", out):
            return f"nvidia-smi: CUDA {m.group(1)}"
    proc = Path("/proc/driver/nvidia/gpus")
    return "/proc/driver/nvidia/gpus" if proc.is_dir() and any(proc.iterdir()) else ""


def cpu_torch_problem(asked: int, stage: str) -> str | None:
    """Why a job that asks for GPUs must not start: a torch without CUDA on a machine with an NVIDIA driver
    would train on the CPU without a word (a venv built on a GPU-less login node, on a shared file system,
    used on a compute node). Judged by what torch reports (torch.version.cuda), not by its wheel's name.
    Without a driver the job trains on the CPU as it always did (fake devices, a laptop)."""
    if asked <= 0:
        return None
    import torch  # here, not at the top: the Snakefile imports this module, and its parse loads no torch

    driver = None if torch.version.cuda else nvidia_driver()
    if not driver:
        return None
    return (f"rule {stage}: asks for {asked} GPU{'s' if asked > 1 else ''} and this machine has an NVIDIA driver "
            f"({driver}), but torch {torch.__version__} has no CUDA (torch.version.cuda is None): it would train "
            f"on the CPU. Install the CUDA build here with `bash setup.sh` (it replaces a CPU torch where a driver "
            f"is present; docs/setup.md), or set resources gpu: 0 to train on the CPU")


@contextlib.contextmanager
def job_devices(resources, stage: str):
    """The job's GPUs on this machine, claimed before anything touches CUDA (`growlm.gpus.claim`:
    CUDA_VISIBLE_DEVICES names them) and held until the job and every process it started have ended; a job
    that asks for GPUs on a machine with a driver and a torch without CUDA is refused first
    (`cpu_torch_problem`). Enter it inside `growlm.errors.job_log`, so that what the claim says goes to the
    job's log."""
    problem = cpu_torch_problem(gpus_per_node(resources), stage)
    if problem:
        raise GrowlmError(problem)
    claimed = gpus.claim(job_gpus(resources), who=f"rule {stage}",
                         log=lambda line: print(f"growlm {stage}: {line}", flush=True))
    try:
        yield claimed
    finally:
        claimed.release()


# ----------------------------------------------------------------------------------------------
# its processes
# ----------------------------------------------------------------------------------------------


def standalone_command(nproc: int, job_file, *, python: str | None = None) -> list[str]:
    """torchrun on this machine with `nproc` processes of `growlm.torchrun JOB.json`, through this
    package's agent (`growlm.node_agent --standalone`)."""
    if nproc < 1:
        raise GrowlmError(f"nproc must be at least 1, got {nproc}")
    return [python or sys.executable, "-m", "growlm.node_agent", "--standalone", "--nproc-per-node", str(nproc),
            str(job_file)]


@dataclass
class Allocation:
    """The nodes of a SLURM job, in SLURM's order (the first runs the job's own process), and how SLURM
    reaches each (its NodeAddr)."""

    job_id: str
    nodes: list[str]
    addresses: list[str]


def _scontrol(*args: str) -> str:
    try:
        out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise GrowlmError("scontrol is not on PATH: a job across nodes asks SLURM for its nodes") from None
    except subprocess.TimeoutExpired:
        raise GrowlmError(f"`scontrol {' '.join(args)}` did not answer in 60 s") from None
    if out.returncode != 0:
        raise GrowlmError(f"`scontrol {' '.join(args)}` failed: {' '.join(out.stderr.split())[:300]}")
    return out.stdout


def _field(text: str, key: str) -> str | None:
    found = re.search(rf"(?:^|\s){key}=(\S+)", text)
    return found.group(1) if found else None


def slurm_allocation(job_id: str | None = None) -> Allocation:
    """The nodes of this SLURM job (SLURM_JOB_ID), asked of SLURM (the job step's environment has no node list)."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise GrowlmError("resources.nodes > 1: this job runs outside a SLURM allocation (no SLURM_JOB_ID); a job "
                          "across nodes runs through the SLURM profile (--profile profiles/slurm)")
    node_list = _field(_scontrol("show", "job", "-o", job_id), "NodeList")
    if not node_list or node_list == "(null)":
        raise GrowlmError(f"SLURM job {job_id} has no nodes (scontrol show job: NodeList={node_list})")
    nodes = _scontrol("show", "hostnames", node_list).split()
    addresses = [_field(_scontrol("show", "node", "-o", node), "NodeAddr") or node for node in nodes]
    return Allocation(job_id, nodes, addresses)


def job_allocation(nodes: int) -> Allocation | None:
    """The SLURM allocation a job across `nodes` > 1 nodes runs in (None for a job on one node), asked for
    before any work: outside SLURM, or with another number of nodes than the job's resources say, one line
    saying so."""
    if nodes <= 1:
        return None
    alloc = slurm_allocation()
    if len(alloc.nodes) != nodes:
        raise GrowlmError(f"resources.nodes = {nodes}, but SLURM job {alloc.job_id} has {len(alloc.nodes)} node(s) "
                          f"({', '.join(alloc.nodes)})")
    return alloc


def _loopback(address: str) -> bool:
    """Whether `address` is loopback for whoever resolves it: a loopback IP or `localhost` (a host name is
    not: what it resolves to on this node says nothing of what the other nodes reach)."""
    if address.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def free_port(host: str = "") -> int:
    """A TCP port free on this machine now (whoever binds it does so moments later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def world_of_one() -> dict:
    """torch.distributed's environment for a process group of this process alone (FSDP2 with offload on one
    device, tests): a rendezvous on this machine's loopback at a free port, rank 0 of 1. The caller keeps a
    MASTER_ADDR and MASTER_PORT already set."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")), "RANK": "0", "WORLD_SIZE": "1",
            "LOCAL_RANK": "0"}


def rendezvous_endpoint(alloc: Allocation, port: int | None = None) -> str:
    """`ADDR:PORT` of the c10d rendezvous: the first node's address with a free port (see the module
    docstring). Raises when the address is loopback for every node while the nodes are other hosts."""
    first = alloc.addresses[0]
    if _loopback(first) and not all(_loopback(a) for a in alloc.addresses):
        raise GrowlmError(f"the first node of SLURM job {alloc.job_id}, {alloc.nodes[0]}, has the address {first}, "
                          f"a loopback address, while its other nodes ({', '.join(alloc.nodes[1:])}) are other hosts: "
                          "they could not reach the rendezvous. Give the node a routable NodeAddr in slurm.conf")
    return f"{first}:{port or free_port()}"


def node_command(alloc: Allocation, *, nproc_per_node: int, cpus_per_task: int, gpus_per_node: int, job_file,
                 endpoint: str, python: str | None = None, port_taken=None) -> list[str]:
    """srun with one task per node of `alloc`, each a torchrun agent (`growlm.node_agent`) for `job_file`;
    `port_taken`: the file the first node's agent writes when the rendezvous port was taken."""
    n = len(alloc.nodes)
    srun = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            f"--jobid={alloc.job_id}"]
    if cpus_per_task > 0:
        srun.append(f"--cpus-per-task={cpus_per_task}")
    if gpus_per_node > 0:
        srun.append(f"--gres=gpu:{gpus_per_node}")
    taken = ["--port-taken", str(port_taken)] if port_taken else []
    # --srun-task: the environment goes with the tasks, but what names a process or a descriptor of this node means
    # nothing on another (growlm.node_agent)
    return [*srun, python or sys.executable, "-m", "growlm.node_agent", "--nnodes", str(n), "--nproc-per-node",
            str(nproc_per_node), "--endpoint", endpoint, "--rdzv-id", f"growlm-{alloc.job_id}", *taken, "--srun-task",
            str(job_file)]


def run_across_nodes(alloc: Allocation, *, job_file, work_dir, log=print, tries: int = RENDEZVOUS_TRIES,
                     **how) -> int:
    """Run the node agents of `alloc` (`node_command` with `how`), on a new rendezvous port when the first
    node's agent found the last one taken (up to `tries` launches); returns the last launch's status."""
    marker = Path(work_dir) / "rendezvous-port-taken"
    rc = 1
    for attempt in range(1, tries + 1):
        marker.unlink(missing_ok=True)
        endpoint = rendezvous_endpoint(alloc)
        cmd = node_command(alloc, job_file=job_file, endpoint=endpoint, port_taken=marker, **how)
        log(f"launching {len(alloc.nodes) * how['nproc_per_node']} processes on SLURM nodes {', '.join(alloc.nodes)}: "
            f"{' '.join(cmd)}")
        rc = run_processes(cmd, log=log, stdout=_stream(sys.stdout), stderr=_stream(sys.stderr))
        if rc == 0 or not marker.is_file():
            return rc
        log(f"the rendezvous port of {endpoint} was taken on {alloc.nodes[0]} when its agent bound it "
            f"({marker.read_text().strip()}); launching again on another port ({attempt} of {tries})")
    return rc


def _stream(stream):
    """Where a child process writes what this process prints: the job's log while `growlm.errors.job_log`
    redirects this process's output there (a child inherits file descriptors, not Python's redirection),
    else the inherited one."""
    try:
        stream.flush()
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return stream


def run_here(cmd: list[str], *, log=print, what: str = "torchrun") -> int:
    """A launch on this machine (torchrun), its output in the job's log."""
    log(f"launching {what}: {' '.join(cmd)}")
    return run_processes(cmd, log=log, stdout=_stream(sys.stdout), stderr=_stream(sys.stderr))


def interfaces(environ: dict | None = None) -> dict:
    """The network interface variables set in this environment (they travel with srun's tasks)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in INTERFACE_VARIABLES if env.get(name)}
