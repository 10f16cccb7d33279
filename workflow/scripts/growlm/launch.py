"""Starting a training job's processes: torchrun on this machine, or one torchrun agent per node.

On one machine a job with several processes runs `python -m torch.distributed.run --standalone
--nproc_per_node=P -m growlm.torchrun JOB.json` (`standalone_command`). A job across N nodes
(`resources.nodes` > 1) runs inside one SLURM allocation of N nodes, as torchtitan's multi-node
script and most SLURM sites do it: the job's own process, on the allocation's first node, starts one
task per node with srun, and each task runs one torchrun agent (`growlm.node_agent`) that starts the
node's P processes; the agents meet at a c10d rendezvous on the first node (`node_command`):

    srun --nodes=N --ntasks=N --ntasks-per-node=1 --cpus-per-task=C --kill-on-bad-exit=1 [--gres=gpu:P]
         python -m growlm.node_agent --nnodes N --nproc-per-node P --endpoint ADDR:PORT --rdzv-id JOB JOB.json

What each part guards against, as seen in the field:
- the allocation is asked of SLURM itself (`slurm_allocation`: `scontrol show job`, `scontrol show
  hostnames`, `scontrol show node`): the SLURM executor plugin's job step removes SLURM_JOB_NODELIST,
  SLURM_NNODES and SLURM_CONF from the job's environment, and keeps only the job id;
- the endpoint is the first node's address as SLURM reaches it (its NodeAddr), with a port that is free
  on that node (the job's process runs there); an endpoint that resolves to this machine's loopback
  while the allocation spans other hosts would make every node a world of its own that waits forever,
  so it stops the job instead (`rendezvous_endpoint`);
- the first node's agent hosts the rendezvous store, every other agent only connects to it (`is_host`
  set explicitly, not guessed from host names);
- `--cpus-per-task` is given: without it each task gets one CPU; `--kill-on-bad-exit=1` and torchrun's
  `--max-restarts=0` end the whole job when one process fails, so the retried job resumes from its
  last checkpoint instead of half a world waiting in a collective;
- the environment goes with the tasks (srun's default `--export=ALL`), the network interface variables
  included: GLOO_SOCKET_IFNAME names the interface gloo uses (by default it takes the one the host
  name resolves to, often loopback), NCCL_SOCKET_IFNAME NCCL's.

Rank 0 may be on any node: everything it writes (checkpoints, the ledger, job.json, the compile cache)
is in the working folder, which the nodes share. Torch-free.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass

from growlm.errors import GrowlmError

INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def standalone_command(nproc: int, module_args: list, *, python: str | None = None) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc_per_node=N -m growlm.torchrun ARGS`
    (the `torchrun` console script, invoked through the interpreter so that the environment's is used)."""
    if nproc < 1:
        raise GrowlmError(f"nproc must be at least 1, got {nproc}")
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "growlm.torchrun", *[str(a) for a in module_args]]


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


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def free_port() -> int:
    """A TCP port free on this machine now (the rendezvous store binds it moments later)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rendezvous_endpoint(alloc: Allocation, port: int | None = None) -> str:
    """`ADDR:PORT` of the c10d rendezvous: the first node's address with a free port (see the module
    docstring). Raises when the address is a loopback one but the nodes are on different hosts."""
    first = alloc.addresses[0]
    if _loopback(first) and not all(_loopback(a) for a in alloc.addresses):
        raise GrowlmError(f"the first node of SLURM job {alloc.job_id}, {alloc.nodes[0]}, has the address {first}, "
                          f"which resolves to loopback here, while its other nodes ({', '.join(alloc.nodes[1:])}) are "
                          "other hosts: they could not reach the rendezvous. Give the node a routable NodeAddr in "
                          "slurm.conf (or fix its name in /etc/hosts)")
    return f"{first}:{port or free_port()}"


def node_command(alloc: Allocation, *, nproc_per_node: int, cpus_per_task: int, gpus_per_node: int, job_file,
                 endpoint: str, python: str | None = None) -> list[str]:
    """srun with one task per node of `alloc`, each a torchrun agent (`growlm.node_agent`) for `job_file`."""
    n = len(alloc.nodes)
    srun = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            f"--jobid={alloc.job_id}"]
    if cpus_per_task > 0:
        srun.append(f"--cpus-per-task={cpus_per_task}")
    if gpus_per_node > 0:
        srun.append(f"--gres=gpu:{gpus_per_node}")
    return [*srun, python or sys.executable, "-m", "growlm.node_agent", "--nnodes", str(n), "--nproc-per-node",
            str(nproc_per_node), "--endpoint", endpoint, "--rdzv-id", f"growlm-{alloc.job_id}", str(job_file)]


def interfaces(environ: dict | None = None) -> dict:
    """The network interface variables set in this environment (they travel with srun's tasks)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in INTERFACE_VARIABLES if env.get(name)}
