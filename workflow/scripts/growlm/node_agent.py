"""The torchrun agent of a training job with several processes: on this machine, or on one node of several.

    python -m growlm.node_agent --standalone --nproc-per-node P JOB.json
    python -m growlm.node_agent --nnodes N --nproc-per-node P --endpoint ADDR:PORT --rdzv-id ID
                                [--port-taken FILE] JOB.json

`growlm.launch` starts it: once on this machine (`standalone_command`), or on every node of a SLURM
allocation (`node_command`: srun, one task per node). It is `torch.distributed.run` - standalone, or
with a c10d rendezvous at ADDR:PORT, the first node's address, where the agents meet and agree on the
world (N x P processes) - and each agent starts its node's P processes of `growlm.torchrun JOB.json`,
the same worker either way.

Three things torchrun leaves to its caller:
- the agent names itself in $GROWLM_PARENT_PID, so that every worker stops when the agent dies, or at
  once if it is gone already (torch starts its workers in sessions of their own, where nothing else would
  stop them; `growlm.errors.stop_with_parent`); the agent itself watches the job that started it;
- the workers hold the job's devices: torch starts them with close_fds, so they would inherit none of the
  job's GPU locks; the agent hands them on over a Unix socket (`growlm.gpus.hand_on`) and every worker
  takes them over before any work (`growlm.gpus.take_over`), so that a worker that outlives its agent and
  its job (kill -9 of the job's process group) keeps the devices until it has ended;
- on the first node, torch's own bind of the rendezvous port is the check that it is free: when it fails
  with EADDRINUSE (another process took the port since the job picked it), the agent writes FILE and
  exits with status 75, and the job launches again on another port (`growlm.launch.run_across_nodes`).
  A check before torch's bind would leave a window between the two.

The first node's agent hosts the rendezvous store and the others connect to it, said explicitly
(`is_host`) rather than guessed from whether ADDR names this machine: where several nodes share an
address a guess makes each node host a store of its own and wait for the others forever. Which node is
the first comes from `--node-index`, by default srun's SLURM_NODEID. torchrun never restarts a failed
world (`--max-restarts=0`): a failed job is retried by Snakemake or requeued by SLURM, and resumes from
its last checkpoint.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from torch.distributed.run import main as torchrun

from growlm import gpus
from growlm.errors import PARENT_ENV, stop_with_parent
from growlm.launch import PORT_TAKEN_EXIT


def torchrun_args(*, nnodes: int, nproc_per_node: int, endpoint: str | None, rdzv_id: str | None, node_index: int,
                  job: str) -> list[str]:
    """torch.distributed.run's arguments for this agent (`endpoint` None: standalone, on this machine)."""
    if endpoint is None:
        return ["--standalone", f"--nproc-per-node={nproc_per_node}", "--max-restarts=0", "-m", "growlm.torchrun",
                job]
    return [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf=is_host={'true' if node_index == 0 else 'false'}", "--max-restarts=0",
            "-m", "growlm.torchrun", job]


def port_taken(err: BaseException) -> str | None:
    """What torch said when the rendezvous store could not bind its port because another process holds it
    (EADDRINUSE, anywhere in the chain of causes: torch wraps its DistNetworkError in a
    RendezvousConnectionError), or None for any other failure."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err)
        if getattr(err, "errno", None) == errno.EADDRINUSE or "EADDRINUSE" in text or "address already in use" in text:
            return " ".join(text.split())[:300]
        err = err.__cause__ or err.__context__
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m growlm.node_agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--standalone", action="store_true", help="all processes on this machine")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--nproc-per-node", type=int, required=True)
    p.add_argument("--endpoint", help="ADDR:PORT of the rendezvous, on the first node")
    p.add_argument("--rdzv-id")
    p.add_argument("--node-index", type=int, default=None, help="this node's place (default $SLURM_NODEID)")
    p.add_argument("--port-taken", help="the file to write when the rendezvous port is taken (then exit 75)")
    p.add_argument("--srun-task", action="store_true",
                   help="started by srun on a node of the job's allocation: the launching node's process and GPU lock "
                        "descriptors in the environment mean nothing here (SLURM ends the step's tasks with the step)")
    p.add_argument("job", help="the training job as JSON (growlm.runner.TrainingJob.to_json)")
    args = p.parse_args(argv)
    if not args.standalone and not (args.endpoint and args.rdzv_id):
        p.error("--endpoint and --rdzv-id, or --standalone")
    index = args.node_index if args.node_index is not None else int(os.environ.get("SLURM_NODEID", "0"))
    if args.srun_task:  # srun's tasks inherit the launching job's environment (srun's --export=ALL)
        os.environ.pop(PARENT_ENV, None)
        os.environ.pop(gpus.HELD_ENV, None)
    stop_with_parent()  # the job that started this agent ($GROWLM_PARENT_PID; under srun, its step daemon)
    held = gpus.inherited()
    if held:  # the job's GPU locks, for the workers (torch closes inherited files)
        os.environ[gpus.HAND_ON_ENV] = gpus.hand_on(held)
    os.environ[PARENT_ENV] = str(os.getpid())  # the workers stop with this agent
    try:
        torchrun(torchrun_args(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
                               endpoint=None if args.standalone else args.endpoint, rdzv_id=args.rdzv_id,
                               node_index=index, job=args.job))
    except Exception as err:
        taken = port_taken(err) if args.endpoint and index == 0 and args.port_taken else None
        if not taken:
            raise
        Path(args.port_taken).write_text(f"{socket.gethostname()}: port {args.endpoint.rsplit(':', 1)[1]}: {taken}\n")
        print(f"growlm node agent: the rendezvous port was taken ({taken}); the job launches again on another port",
              file=sys.stderr, flush=True)
        return PORT_TAKEN_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
