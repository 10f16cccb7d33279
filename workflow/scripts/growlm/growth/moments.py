"""Optimizer-state carry-over: grow the members' AdamW moments along with their weights.

Off by default (refinement restarts AdamW with a short warm-up). With `carry` in the method's chain
the grow job maps the members' saved moments (`growlm.optim_state`) to the grown model with the
*linear part* of the same operator and seed:

    m' = grow(m) - grow(0)        (the same for the second moment v)

Every operator that is not learned is affine in the weights: copies, splits, zero or mean padding,
scaled LayerNorm gains, plus new units drawn from the seed. Growing the moments as if they were
weights and subtracting the growth of an all-zero model with the same seed keeps exactly the linear
map and drops the random new units, whose moments start at zero.

This is a heuristic, stated as such: the gradient of a grown parameter is not the grown gradient
(a weight split by 1/k across k copies receives the full gradient in each copy), so the carried
moments are of the right place and sign but, for split weights, not of the exact scale. The learned
operators (`OperatorSpec.learned`: `ligo`, `mango`) are not affine in the weights and refuse it.

The second moment needs one more rule. A linear map with negative coefficients (LEMON's uneven splits
write a weight as the difference of two others) can send v to zero or below where m is not zero; v is
clamped at zero, and AdamW's first steps there are m / (sqrt(v) + eps), thousands of times the rate
(measured: 14,410 such entries of 339,328 in a LEMON-grown d64 model, whose refinement then ended 0.17
higher than without carry-over; bench/RESULTS.md, section 9c). So v is raised where needed to keep
|m| / sqrt(v) at most the largest ratio found in the members' own moments (`_largest_step`): the grown
state never asks for a larger first step than a member's did. Copies and splits with positive
coefficients never exceed that bound (0.1% is added to it so that a copy of the very entry that holds
the largest ratio is not moved by rounding), so for them the rule changes nothing.
"""

from __future__ import annotations

import copy

import torch

from growlm.errors import GrowlmError
from growlm.growth.chain import grow
from growlm.methods import OPERATORS, method_chain
from growlm.optim_state import MOMENT_KINDS


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
    chain = method_chain(method)
    learned = [name for name in chain if OPERATORS[name].learned]
    if learned:
        raise GrowlmError(f"optimizer-state carry-over is not defined for the learned operator(s) "
                          f"{', '.join(learned)}: their growth map is trained, not affine in the weights")
    if len(member_moments) != len(members):
        raise GrowlmError(f"{len(members)} members but {len(member_moments)} sets of optimizer moments")
    method_arg = chain if len(chain) > 1 else chain[0]
    kw = dict(n_embd=n_embd, n_layer=n_layer, n_head=n_head, seed=seed, **options)
    bound = _largest_step(member_moments)
    zero = grow([_as_weights(m, None, "exp_avg") for m in members], method_arg, **kw)
    base = {name: p.detach().clone() for name, p in zero.named_parameters()}
    out: dict[str, dict[str, torch.Tensor]] = {name: {} for name in base}
    for kind in MOMENT_KINDS:
        grown = grow([_as_weights(m, mm, kind) for m, mm in zip(members, member_moments)], method_arg, **kw)
        for name, p in grown.named_parameters():
            moment = p.detach() - base[name]
            out[name][kind] = moment.clamp_min(0.0) if kind == "exp_avg_sq" else moment
    if bound is not None:
        for moments in out.values():
            moments["exp_avg_sq"] = torch.maximum(moments["exp_avg_sq"], (moments["exp_avg"] / bound) ** 2)
    return out


def _largest_step(member_moments: list[dict]) -> float | None:
    """The largest |m| / sqrt(v) over the members' saved moments, entries with v > 0 (None: none has)."""
    largest = None
    for moments in member_moments:
        for kinds in moments.values():
            m, v = kinds.get("exp_avg"), kinds.get("exp_avg_sq")
            if m is None or v is None or not bool((v > 0).any()):
                continue
            ratio = float((m[v > 0].abs() / v[v > 0].sqrt()).max())
            largest = ratio if largest is None else max(largest, ratio)
    return largest * 1.001 if largest else None


def inherited_masks(members: list[torch.nn.Module], method, *, n_embd: int, n_layer: int,
                    n_head: int | None = None, seed: int = 0, **options) -> dict[str, torch.Tensor]:
    """{parameter name: bool tensor}: which entries of the grown model come from the members' weights
    (the `freeze` refinement operator holds them fixed for a first phase).

    The same linear part as the moments: an entry is inherited when the operator's output there
    depends on the members' weights, i.e. when grow(w) - grow(0) is not zero for members whose
    every weight is drawn from [1, 2] (positive, so no copy, split or mean can cancel). New random
    units, zero blocks and new LayerNorm gains (constants of the seed) are not."""
    chain = method_chain(method)
    learned = [name for name in chain if OPERATORS[name].learned]
    if learned:
        raise GrowlmError(f"inherited weights are not defined for the learned operator(s) {', '.join(learned)}")
    method_arg = chain if len(chain) > 1 else chain[0]
    kw = dict(n_embd=n_embd, n_layer=n_layer, n_head=n_head, seed=seed, **options)
    gen = torch.Generator().manual_seed(7)

    def probe(member):
        twin = copy.deepcopy(member)
        with torch.no_grad():
            for p in twin.parameters():
                p.copy_(1.0 + torch.rand(p.shape, generator=gen, dtype=torch.float64).to(p.dtype))
        return twin

    zero = grow([_as_weights(m, None, "exp_avg") for m in members], method_arg, **kw)
    base = {name: p.detach().clone() for name, p in zero.named_parameters()}
    grown = grow([probe(m) for m in members], method_arg, **kw)
    return {name: (p.detach() - base[name]) != 0 for name, p in grown.named_parameters()}
