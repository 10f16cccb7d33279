"""Optimizer-state files: a trained member's final AdamW moments, and the grown model's.

Every member saves its final AdamW moments by parameter name
(`optimizer.safetensors` beside the model), the grow job maps them to the grown model
(`growlm.growth.moments`) and writes them (`moments.safetensors`), and the refinement's AdamW starts
from them (`apply_moments`) with the members' step count, for Adam's bias correction. Files hold
'<parameter name>/<exp_avg | exp_avg_sq>' tensors and the step under '__step__'; nothing is
unpickled.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from growlm.atomic import atomic_path
from growlm.checkpoint import is_fsdp
from growlm.errors import GrowlmError

MOMENT_KINDS = ("exp_avg", "exp_avg_sq")
STEP_KEY = "__step__"
MEMBER_MOMENTS_FILE = "optimizer.safetensors"  # a member's final AdamW moments (every small job writes it)
GROWN_MOMENTS_FILE = "moments.safetensors"  # the grown model's carried-over moments


def optimizer_moments(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """AdamW's moments keyed '<parameter name>/<kind>', plus the step count under '__step__'."""
    core = getattr(model, "module", model)
    out, seen, step = {}, set(), 0.0
    for name, p in core.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        state = optimizer.state.get(p, {})
        for kind in MOMENT_KINDS:
            if kind in state:
                out[f"{name}/{kind}"] = state[kind].detach().float().cpu().contiguous()
        if "step" in state:
            step = max(step, float(state["step"]))
    out[STEP_KEY] = torch.tensor([step])
    return out


def save_moments(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write the optimizer's moments (not under FSDP2: sharded moments are not gathered for this)."""
    if is_fsdp(getattr(model, "module", model)):
        return  # the grow job says so if carry-over is asked for
    with atomic_path(path) as tmp:
        save_file(optimizer_moments(model, optimizer), tmp)


def load_moments(path: str | Path) -> tuple[dict[str, dict[str, torch.Tensor]], float]:
    """({parameter name: {kind: tensor}}, step) from a file written by `save_moments`."""
    path = Path(path)
    if not path.is_file():
        raise GrowlmError(f"optimizer-state carry-over needs {path}, which is missing (the member was "
                          "trained by an older growlm or under FSDP2, which does not save its moments)")
    flat = load_file(path)
    step = float(flat.pop(STEP_KEY, torch.tensor([0.0]))[0])
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        name, kind = key.rsplit("/", 1)
        out.setdefault(name, {})[kind] = t
    return out, step


def save_grown_moments(path: str | Path, moments: dict[str, dict[str, torch.Tensor]], step: float) -> None:
    flat = {f"{name}/{kind}": t.contiguous() for name, kinds in moments.items() for kind, t in kinds.items()}
    flat[STEP_KEY] = torch.tensor([float(step)])
    save_file(flat, str(path))


def apply_moments(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> int:
    """Start `optimizer` (AdamW) from the moments saved at `path`; returns how many parameters got
    them. Parameters without saved moments start fresh, as usual."""
    core = getattr(model, "module", model)
    if is_fsdp(core):
        raise GrowlmError("optimizer-state carry-over is not supported under FSDP2; use fresh optimizer state")
    moments, step = load_moments(path)
    fused = bool(optimizer.defaults.get("fused"))
    applied = 0
    for name, p in core.named_parameters():
        kinds = moments.get(name)
        if not kinds or any(k not in kinds for k in MOMENT_KINDS):
            continue
        if kinds["exp_avg"].shape != p.shape:
            raise GrowlmError(f"carried moment of {name} has shape {tuple(kinds['exp_avg'].shape)}, the "
                              f"parameter {tuple(p.shape)}")
        step_t = torch.tensor(step, dtype=torch.float32, device=p.device if fused else "cpu")
        optimizer.state[p] = {"step": step_t,
                              **{k: kinds[k].to(device=p.device, dtype=p.dtype).clone() for k in MOMENT_KINDS}}
        applied += 1
    return applied
