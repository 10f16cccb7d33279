"""The torchrun entry point: one process of a training job that runs on several devices.

    torchrun --standalone --nproc_per_node=N -m growlm.torchrun \\
        --model-config model.json | --init-model DIR | --grown-model DIR [--ramps ramps.json] \\
        --train-file train.npy --val-file val.npy --train-config train.json [--plan plan.json] \\
        --ckpt-dir CK --ledger ledger.csv [--out-dir MODEL] [--gpu-share S]

(`growlm.runner.launch_command(N, args)` builds that command line.) Every process initialises the
process group (NCCL on CUDA, gloo on the CPU), builds the same model, wraps it as the plan says
(`growlm.distributed.wrap_model`) and runs `growlm.train.train`, which gives each process its rows
of the same global batch. Only rank 0 writes files: the ledger, the checkpoints (gathered into one
full, unwrapped state dict, so that a checkpoint loads under any strategy or none) and the saved
model. The ledger's FLOPs count the global batch. Without a plan, several processes use DDP.

A refinement starts from a grown model (`--grown-model`: what `growlm.growth.save_grown` wrote, a
plain model or a `GrownModel` with growth masks, whose ramp lengths `--ramps` sets as the in-process
refinement does); a `GrownModel` trains under DDP (FSDP2 shards plain models' blocks only) and is saved
as the plain GPT-2 it has become once its ramps are done.

If a process runs out of CUDA memory, it writes the next smaller plan (`next_smaller`) over `--plan`
and exits with status 1; torchrun then stops the other processes, and the retried job resumes from
the last checkpoint with the smaller plan.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from growlm.tokens import load_tokens
from growlm.distributed import init_process_group, save_full_model, wrap_model
from growlm.errors import GrowlmError, user_errors
from growlm.growth import load_grown
from growlm.memory.estimate import apply_plan, next_smaller, read_plan, write_plan
from growlm.model import build_model, load_model
from growlm.runner import limit_gpu_memory
from growlm.train import train
from growlm.train_config import TrainConfig


def _json_arg(value: str) -> dict:
    """A JSON argument: a file holding it, or the JSON text itself."""
    return json.loads(Path(value).read_text()) if Path(value).is_file() else json.loads(value)


def _build(args):
    if args.init_model:
        return load_model(args.init_model)
    if args.grown_model:
        model = load_grown(args.grown_model)
        ramps = _json_arg(args.ramps) if args.ramps else {}
        if ramps and hasattr(model, "set_ramps"):
            model.set_ramps(**ramps)
        return model
    spec = _json_arg(args.model_config)
    seed = spec.pop("seed", 0)
    return build_model(seed=seed, **spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m growlm.torchrun", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-config", help="JSON (file or string) for growlm.model.build_model; 'seed' optional")
    src.add_argument("--init-model", help="a saved model folder to continue from")
    src.add_argument("--grown-model", help="a grown model folder (growlm.growth.save_grown) to refine")
    p.add_argument("--ramps", help="JSON (file or string): the grown model's mask-ramp lengths (set_ramps)")
    p.add_argument("--train-file", required=True)
    p.add_argument("--val-file", required=True)
    p.add_argument("--train-config", required=True, help="JSON (file or string): TrainConfig.to_json()")
    p.add_argument("--plan", help="plan.json from growlm.memory (default: DDP with several processes)")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--out-dir", help="save the trained model here (rank 0)")
    p.add_argument("--summary", help="write train()'s summary here as JSON (rank 0)")
    p.add_argument("--tokenizer-dir", help="copied into --out-dir with the model")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--gpu-share", type=float, default=1.0, help="the share of each GPU's memory a process may use")
    args = p.parse_args(argv)

    rank, world, device = init_process_group(args.device)
    limit_gpu_memory(device, args.gpu_share)
    log = print if rank == 0 else (lambda *_: None)
    try:
        with user_errors("torchrun"):
            cfg = TrainConfig.from_dict(_json_arg(args.train_config), device=device)
            plan = read_plan(args.plan) if args.plan else None
            if plan is not None:
                if plan.n_devices != world:
                    raise GrowlmError(f"the plan is for {plan.n_devices} devices, torchrun started {world}")
                cfg = apply_plan(cfg, plan)
                log(f"plan: {plan.describe()}")
            model = wrap_model(_build(args), plan, device=device)
            try:
                summary = train(model, load_tokens(args.train_file), load_tokens(args.val_file), cfg,
                                ckpt_dir=args.ckpt_dir, ledger_path=args.ledger, log=log)
            except torch.cuda.OutOfMemoryError as err:
                smaller = next_smaller(plan) if plan is not None else None
                first = str(err).splitlines()[0] if str(err) else ""
                if smaller is None:
                    raise GrowlmError(f"rank {rank}: CUDA out of memory with the smallest plan ({first})") from None
                if args.plan:
                    write_plan(smaller, args.plan)
                print(f"growlm torchrun: rank {rank}: CUDA out of memory ({first}); wrote the next smaller "
                      f"plan to {args.plan}: {smaller.describe()}. Rerun to resume from the last checkpoint.",
                      file=sys.stderr, flush=True)
                os._exit(1)  # the other ranks wait in collectives: torchrun stops them
            if args.out_dir:
                core = getattr(model, "module", model)
                if hasattr(core, "to_plain"):  # a grown model with growth masks: a plain model by now
                    model = core.to_plain()
                save_full_model(model, args.out_dir, tokenizer_dir=args.tokenizer_dir,
                                extra={"train": summary, "plan": asdict(plan) if plan else None, "world": world})
                if rank == 0:
                    shutil.copy(args.ledger, Path(args.out_dir) / "ledger.csv")
            if args.summary and rank == 0:
                Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
                Path(args.summary).write_text(json.dumps({**summary, "world": world}, indent=2, default=str))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
