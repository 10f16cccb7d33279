"""Several processes: the process group, and the model wrapped as a memory plan's strategy says.

`init_process_group` starts torch.distributed from torchrun's environment (NCCL on CUDA, gloo on the
CPU; a world of one without torchrun). `wrap_model` wraps a GPT-2 for the plan's strategy: DDP, or
FSDP2 `fully_shard` on every block and then the root, optionally with `CPUOffloadPolicy`; every
strategy keeps fp32 parameters, so they compute the same thing. `save_full_model` gathers FSDP2
shards and saves a plain model on rank 0. The torchrun entry point is `growlm.torchrun`.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel

from growlm.errors import GrowlmError
from growlm.families import family_of
from growlm.launch import interfaces, world_of_one
from growlm.model import save_model


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
            alone = world_of_one()  # growlm.launch says where a process group meets
            os.environ.update({k: os.environ.get(k, v) for k, v in alone.items() if k.startswith("MASTER_")})
            os.environ.update({k: v for k, v in alone.items() if not k.startswith("MASTER_")})
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    return dist.get_rank(), dist.get_world_size(), device


def ranks_where(device: str) -> dict:
    """Where every process of this job runs: {"world", "nodes" (in rank order, each once), "ranks": [{rank,
    local_rank, node_rank, node, host, device, visible_devices, interfaces}]}, gathered from every rank (a
    collective under torchrun; rank 0 writes it into growlm.json). `node` is the SLURM node name where
    SLURM runs the process (SLURMD_NODENAME: several nodes may share a host), else the host name;
    `node_rank` is the agent's place in a rendezvous across nodes (torchrun's GROUP_RANK)."""
    env = os.environ
    mine = {"rank": int(env.get("RANK", 0)), "local_rank": int(env.get("LOCAL_RANK", 0)),
            "node_rank": int(env.get("GROUP_RANK", 0)), "node": env.get("SLURMD_NODENAME") or socket.gethostname(),
            "host": socket.gethostname(), "device": str(device),
            "visible_devices": env.get("CUDA_VISIBLE_DEVICES"), "interfaces": interfaces()}
    ranks = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    nodes = list(dict.fromkeys(r["node"] for r in ranks))
    return {"world": len(ranks), "nodes": nodes, "ranks": ranks}


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
        model.to(device)
        dev = torch.device(device)
        return DistributedDataParallel(model, device_ids=[dev.index or 0] if dev.type == "cuda" else None,
                   gradient_as_bucket_view=True)
    if strategy in ("fsdp", "fsdp_offload"):
        kw = {}
        if strategy == "fsdp_offload":
            kw["offload_policy"] = CPUOffloadPolicy()
            model._growlm_cpu_offload = True  # train() must not move it to the GPU
        else:
            model.to(device)
        try:
            blocks = family_of(model).blocks(model)
        except (GrowlmError, AttributeError):
            raise GrowlmError(f"FSDP2 wrapping needs a plain GPT-2 or Llama model (its blocks are sharded); got "
                              f"{type(model).__name__}") from None
        for block in blocks:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        return model
    raise GrowlmError(f"unknown strategy {strategy!r}")


def save_full_model(model: torch.nn.Module, out_dir, **kwargs) -> None:
    """Save the unwrapped model (FSDP2 shards gathered; a collective) on rank 0 only."""
    core = getattr(model, "module", model)
    if isinstance(core, FSDPModule):
        state = get_model_state_dict(core, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if is_rank0():
            plain = family_of(core).model_class(core.config)
            plain.load_state_dict(state, strict=False)
            plain.tie_weights()
            save_model(plain, out_dir, **kwargs)
    elif is_rank0():
        save_model(core.to("cpu"), out_dir, **kwargs)
    if dist.is_initialized():
        dist.barrier()
