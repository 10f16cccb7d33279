"""Training on several processes: a `torchrun` entry point and the model wrapping a plan asks for.

    torchrun --standalone --nproc_per_node=N -m growlm.distributed \\
        --model-config model.json | --init-model DIR   --train-file train.npy --val-file val.npy \\
        --train-config train.json [--plan plan.json] --ckpt-dir CK --ledger ledger.csv [--out-dir MODEL]

(`launch_command(N, args)` builds that command line.) Every process initialises the process group
(NCCL on CUDA, gloo on the CPU), builds the same model, wraps it as the plan says (`wrap_model`:
DDP, or FSDP2 `fully_shard` on every block and then the root, optionally with `CPUOffloadPolicy`)
and runs `growlm.train.train`, which gives each process its rows of the same global batch. Only rank
0 writes files: the ledger, the checkpoints (gathered into one full, unwrapped state dict, so that a
checkpoint loads under any strategy or none) and the saved model. The ledger's FLOPs count the
global batch. Without a plan, several processes use DDP.

If a process runs out of CUDA memory, it writes the next smaller plan (`growlm.plan.next_smaller`)
over `--plan` and exits with status 1; torchrun then stops the other processes, and the retried job
resumes from the last checkpoint with the smaller plan.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
from dataclasses import asdict, fields
from pathlib import Path

import torch
import torch.distributed as dist

from growlm.errors import GrowlmError, user_errors


def launch_command(nproc: int, module_args: list[str], *, python: str | None = None) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc_per_node=N -m growlm.distributed ARGS`
    (the `torchrun` console script, invoked through the interpreter so that the environment's is used)."""
    if nproc < 1:
        raise GrowlmError(f"nproc must be at least 1, got {nproc}")
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "growlm.distributed", *[str(a) for a in module_args]]


def init_process_group(device: str | None = None) -> tuple[int, int, str]:
    """Initialise torch.distributed from torchrun's environment (a world of one without it);
    return (rank, world size, device) with device `cuda:<local rank>` or `cpu`."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = torch.device(device).type == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # a world of one (FSDP2 offload on a single GPU, tests)
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    return dist.get_rank(), dist.get_world_size(), device


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_rank0() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def wrap_model(model: torch.nn.Module, plan=None, *, device: str = "cpu") -> torch.nn.Module:
    """The model wrapped for `plan.strategy` ("single": unchanged; "ddp"; "fsdp"; "fsdp_offload").
    DDP and FSDP need an initialised process group (FSDP2 with offload starts a world of one if
    there is none). FSDP2 keeps fp32 parameters (train() autocasts to bf16 on CUDA, as without FSDP),
    so every strategy computes the same thing."""
    strategy = getattr(plan, "strategy", None) or ("ddp" if dist.is_initialized() and dist.get_world_size() > 1
                                                   else "single")
    if strategy == "single":
        return model
    if strategy == "fsdp_offload" and not dist.is_initialized():
        init_process_group(device)
    if not dist.is_initialized():
        raise GrowlmError(f"strategy {strategy} needs torch.distributed (run under torchrun)")
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model.to(device)
        dev = torch.device(device)
        return DDP(model, device_ids=[dev.index or 0] if dev.type == "cuda" else None,
                   gradient_as_bucket_view=True)
    if strategy in ("fsdp", "fsdp_offload"):
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        kw = {}
        if strategy == "fsdp_offload":
            kw["offload_policy"] = CPUOffloadPolicy()
            model._growlm_cpu_offload = True  # train() must not move it to the GPU
        else:
            model.to(device)
        blocks = getattr(getattr(model, "transformer", None), "h", None)
        if blocks is None:
            raise GrowlmError(f"FSDP2 wrapping needs a GPT-2 (`transformer.h` blocks); got {type(model).__name__}")
        for block in blocks:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        return model
    raise GrowlmError(f"unknown strategy {strategy!r}")


def _build(args, device: str):
    from growlm.model import build_model, load_model

    if args.init_model:
        return load_model(args.init_model)
    spec = json.loads(Path(args.model_config).read_text()) if Path(args.model_config).is_file() \
        else json.loads(args.model_config)
    seed = spec.pop("seed", 0)
    return build_model(seed=seed, **spec)


def _train_config(args, device: str):
    from growlm.train import TrainConfig

    src = args.train_config
    spec = json.loads(Path(src).read_text()) if Path(src).is_file() else json.loads(src)
    known = {f.name for f in fields(TrainConfig)}
    unknown = set(spec) - known
    if unknown:
        raise GrowlmError(f"unknown training settings {sorted(unknown)}")
    spec["device"] = device
    return TrainConfig(**spec)


def save_full_model(model: torch.nn.Module, out_dir, **kwargs) -> None:
    """Save the unwrapped model (FSDP2 shards gathered; a collective) on rank 0 only."""
    from growlm.model import save_model

    core = getattr(model, "module", model)
    from torch.distributed.fsdp import FSDPModule

    if isinstance(core, FSDPModule):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(core, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if is_rank0():
            from transformers import GPT2LMHeadModel

            plain = GPT2LMHeadModel(core.config)
            plain.load_state_dict(state, strict=False)
            plain.tie_weights()
            save_model(plain, out_dir, **kwargs)
    elif is_rank0():
        save_model(core.to("cpu"), out_dir, **kwargs)
    if dist.is_initialized():
        dist.barrier()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m growlm.distributed", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-config", help="JSON (file or string) for growlm.model.build_model; 'seed' optional")
    src.add_argument("--init-model", help="a saved model folder to continue from")
    p.add_argument("--train-file", required=True)
    p.add_argument("--val-file", required=True)
    p.add_argument("--train-config", required=True, help="JSON (file or string) of TrainConfig fields")
    p.add_argument("--plan", help="plan.json from growlm.plan (default: DDP with several processes)")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ledger", required=True)
    p.add_argument("--out-dir", help="save the trained model here (rank 0)")
    p.add_argument("--summary", help="write train()'s summary here as JSON (rank 0)")
    p.add_argument("--tokenizer-dir", help="copied into --out-dir with the model")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    args = p.parse_args(argv)

    from growlm.data import load_tokens
    from growlm.plan import apply_plan, next_smaller, read_plan, write_plan
    from growlm.train import train

    rank, world, device = init_process_group(args.device)
    log = print if rank == 0 else (lambda *_: None)
    try:
        with user_errors("distributed"):
            cfg = _train_config(args, device)
            plan = read_plan(args.plan) if args.plan else None
            if plan is not None:
                if plan.n_devices != world:
                    raise GrowlmError(f"the plan is for {plan.n_devices} devices, torchrun started {world}")
                cfg = apply_plan(cfg, plan)
                log(f"plan: {plan.describe()}")
            model = wrap_model(_build(args, device), plan, device=device)
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
                print(f"growlm distributed: rank {rank}: CUDA out of memory ({first}); wrote the next smaller "
                      f"plan to {args.plan}: {smaller.describe()}. Rerun to resume from the last checkpoint.",
                      file=sys.stderr, flush=True)
                os._exit(1)  # the other ranks wait in collectives: torchrun stops them
            if args.out_dir:
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
