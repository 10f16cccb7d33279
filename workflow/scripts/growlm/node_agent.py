"""One node's part of a training job across nodes: a torchrun agent that starts the node's processes.

    python -m growlm.node_agent --nnodes N --nproc-per-node P --endpoint ADDR:PORT --rdzv-id ID JOB.json

`growlm.launch.node_command` starts one of these on every node of a SLURM allocation (srun, one
task per node). Each is `torch.distributed.run` with a c10d rendezvous at ADDR:PORT, the first node's
address: the agents meet there, agree on the world (N x P processes) and each starts its node's P
processes of `growlm.torchrun JOB.json` - the same worker a one-machine launch runs.

The first node's agent hosts the rendezvous store and the others connect to it, said explicitly
(`is_host`) rather than guessed from whether ADDR names this machine: where several nodes share an
address (nodes on one host, or an address that every node takes for its own) a guess makes each node
host a store of its own and wait for the others forever. Which node is the first comes from
`--node-index`, by default srun's SLURM_NODEID. torchrun never restarts a failed world
(`--max-restarts=0`): a failed job is retried by Snakemake or requeued by SLURM, and resumes from its
last checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys

from torch.distributed.run import main as torchrun


def torchrun_args(*, nnodes: int, nproc_per_node: int, endpoint: str, rdzv_id: str, node_index: int,
                  job: str) -> list[str]:
    """torch.distributed.run's arguments for this node's agent."""
    return [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf=is_host={'true' if node_index == 0 else 'false'}", "--max-restarts=0",
            "-m", "growlm.torchrun", job]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m growlm.node_agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--nproc-per-node", type=int, required=True)
    p.add_argument("--endpoint", required=True, help="ADDR:PORT of the rendezvous, on the first node")
    p.add_argument("--rdzv-id", required=True)
    p.add_argument("--node-index", type=int, default=None, help="this node's place (default $SLURM_NODEID)")
    p.add_argument("job", help="the training job as JSON (growlm.runner.TrainingJob.to_json)")
    args = p.parse_args(argv)
    index = args.node_index if args.node_index is not None else int(os.environ.get("SLURM_NODEID", "0"))
    torchrun(torchrun_args(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, endpoint=args.endpoint,
                           rdzv_id=args.rdzv_id, node_index=index, job=args.job))
    return 0


if __name__ == "__main__":
    sys.exit(main())
