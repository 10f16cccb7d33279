"""Optimizer-state carry-over: grow the members' AdamW moments along with their weights.

Off by default (refinement restarts AdamW with a short warm-up). With `grow.optimizer_state: carry`
each member saves its final AdamW moments by parameter name (`optimizer.safetensors`, written by
training), and the grow job maps them to the grown model with the *linear part* of the same operator
and seed:

    m' = grow(m) - grow(0)        (the same for the second moment v)

Every non-learned operator is affine in the weights: copies, splits, zero or mean padding, scaled
LayerNorm gains, plus new units drawn from the seed. Growing the moments as if they were weights and
subtracting the growth of an all-zero model with the same seed keeps exactly the linear map and
drops the random new units, whose moments start at zero. The refinement's AdamW then starts from
these moments and the members' step count (for Adam's bias correction).

This is a heuristic, stated as such: the gradient of a grown parameter is not the grown gradient
(a weight split by 1/k across k copies receives the full gradient in each copy), so the carried
moments are of the right place and sign but, for split weights, not of the exact scale. The learned
operators (`ligo`, `mango`) are not affine in the weights and refuse carry-over.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from growlm.errors import GrowlmError

MOMENT_KINDS = ("exp_avg", "exp_avg_sq")
NOT_AFFINE = ("ligo", "mango")
STEP_KEY = "__step__"


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
    from safetensors.torch import save_file

    from growlm.checkpoint import _is_fsdp

    if _is_fsdp(getattr(model, "module", model)):
        return  # sharded moments are not gathered for carry-over; the grow job says so if asked
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(optimizer_moments(model, optimizer), tmp)
    tmp.replace(path)


def load_moments(path: str | Path) -> tuple[dict[str, dict[str, torch.Tensor]], float]:
    """({parameter name: {kind: tensor}}, step) from a file written by `save_moments`."""
    from safetensors.torch import load_file

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


def _as_weights(member: torch.nn.Module, moments: dict[str, dict[str, torch.Tensor]] | None, kind: str):
    """A copy of `member` whose parameters hold its `kind` moments (zeros where there are none, and
    everywhere if `moments` is None)."""
    twin = copy.deepcopy(member)
    with torch.no_grad():
        for name, p in twin.named_parameters():
            m = None if moments is None else moments.get(name, {}).get(kind)
            if m is not None and m.shape != p.shape:
                raise GrowlmError(f"saved moment {name}/{kind} has shape {tuple(m.shape)}, the member's "
                                  f"parameter {tuple(p.shape)}")
            p.copy_(m if m is not None else torch.zeros_like(p))
    return twin


def grow_moments(members: list[torch.nn.Module], member_moments: list[dict], method, *, n_embd: int,
                 n_layer: int, n_head: int | None = None, seed: int = 0, **options) -> dict[str, dict]:
    """The grown model's moments {parameter name: {kind: tensor}}: the linear part of the operator
    (or chain) applied to the members' moments; see the module docstring."""
    from growlm.experiment import method_chain
    from growlm.growth import grow

    chain = method_chain(method)
    learned = [name for name in chain if name in NOT_AFFINE]
    if learned:
        raise GrowlmError(f"optimizer-state carry-over is not defined for the learned operator(s) "
                          f"{', '.join(learned)}: their growth map is trained, not affine in the weights")
    if len(member_moments) != len(members):
        raise GrowlmError(f"{len(members)} members but {len(member_moments)} sets of optimizer moments")
    method_arg = chain if len(chain) > 1 else chain[0]
    kw = dict(n_embd=n_embd, n_layer=n_layer, n_head=n_head, seed=seed, **options)
    zero = grow([_as_weights(m, None, "exp_avg") for m in members], method_arg, **kw)
    base = {name: p.detach().clone() for name, p in zero.named_parameters()}
    out: dict[str, dict[str, torch.Tensor]] = {name: {} for name in base}
    for kind in MOMENT_KINDS:
        grown = grow([_as_weights(m, mm, kind) for m, mm in zip(members, member_moments)], method_arg, **kw)
        for name, p in grown.named_parameters():
            moment = p.detach() - base[name]
            out[name][kind] = moment.clamp_min(0.0) if kind == "exp_avg_sq" else moment
    return out


def save_grown_moments(path: str | Path, moments: dict[str, dict[str, torch.Tensor]], step: float) -> None:
    from safetensors.torch import save_file

    flat = {f"{name}/{kind}": t.contiguous() for name, kinds in moments.items() for kind, t in kinds.items()}
    flat[STEP_KEY] = torch.tensor([float(step)])
    save_file(flat, str(path))


def apply_moments(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> int:
    """Start `optimizer` (AdamW) from the moments saved at `path`; returns how many parameters got
    them. Parameters without saved moments start fresh, as usual."""
    from growlm.checkpoint import _is_fsdp

    core = getattr(model, "module", model)
    if _is_fsdp(core):
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
