"""The torchrun entry point: one process of a training job that runs on several devices.

    python -m torch.distributed.run --standalone --nproc_per_node=N -m growlm.torchrun JOB.json

(`growlm.runner.run_job` writes JOB.json - a `growlm.runner.TrainingJob` - and launches it through
`growlm.launch`, whose agent, `growlm.node_agent`, runs that on this machine or on each node.) A process
first asks to stop when its agent dies, and stops at once if the agent is gone already
(`growlm.errors.stop_with_parent`: torch starts it in a session of its own, where nothing else would
stop it); then it takes over the job's GPU locks from its agent (`growlm.gpus.take_over`: torch passes
it no open file), so that the job's devices stay claimed until it has ended, whatever ended before it. Every process runs `growlm.runner.execute(job)`, the function a
one-process job runs: it initialises the process group (NCCL on CUDA, gloo on the CPU), builds the
same model or loads the same grown one, wraps it as the plan says (`growlm.distributed.wrap_model`)
and trains it with `growlm.train.train`, which gives each process its rows of the same global batch.
Only rank 0 writes files: the ledger, the checkpoints (gathered into one full, unwrapped state dict,
so that a checkpoint loads under any strategy or none), the saved model and the summary. The ledger's
FLOPs count the global batch.

A grown model with growth masks (`GrownModel`) trains under DDP (FSDP2 shards plain models' blocks
only) and is saved as the plain model it has become once its ramps are done. If a process runs out of
CUDA memory, it writes the next smaller plan over the job's plan and exits with status 1; torchrun
then stops the other processes, and the retried job resumes from the last checkpoint with it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch.distributed as dist

from growlm.errors import stop_with_parent, user_errors
from growlm.gpus import take_over
from growlm.runner import TrainingJob, execute


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m growlm.torchrun", description=__doc__.split("\n\n")[0])
    p.add_argument("job", help="the training job as JSON (growlm.runner.TrainingJob.to_json)")
    args = p.parse_args(argv)
    stop_with_parent()  # the agent that started it ($GROWLM_PARENT_PID)
    try:
        with user_errors("torchrun"):
            take_over()  # the job's devices, held until this process ends
            execute(TrainingJob.from_json(Path(args.job).read_text()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
