"""Depth operators: zero-writer block insertion (exact), G_stack, interleave, member stacking.

All keep the width. They accept a plain model of either family or a grown module with growth masks
(`GrownModel`, e.g. the output of `concat`): then the inner model's blocks are rearranged and the
module keeps its masks/ramps (`GrownModel.with_blocks`). A zero-writer block is exact in both
families: its attention output projection and its MLP's down projection (and their biases, where a
family has them) are zero, so x + Block(x) = x whatever the norm, the gate or the rotary positions.
"""

from __future__ import annotations

import torch

from growlm.errors import GrowlmError
from growlm.growth.algebra import WRITER_KEYS, insertion_plan, neighbour_of, pack, target_config, unpack, with_blocks
from growlm.growth.registry import implements
from growlm.methods import OPERATORS
from growlm.shape import ModelShape


def _rebuild(model, blocks: list[dict], block_map: list[int | None]):
    """`model` with a new block list (`block_map[i]`: source block of target block i, None = new)."""
    if hasattr(model, "with_blocks"):  # GrownGPT2: keep the growth masks
        return model.with_blocks(blocks, block_map)
    W = unpack(model)
    s = ModelShape.of(model)
    return pack(with_blocks(W, blocks), target_config(model.config, n_embd=s.d, n_layer=len(blocks), n_head=s.h))


def _core(model):
    return getattr(model, "inner", model)


def _zero_writers(blk: dict) -> dict:
    blk = {k: None if v is None else v.clone() for k, v in blk.items()}
    for k in WRITER_KEYS:
        blk[k] = None if blk[k] is None else torch.zeros_like(blk[k])
    return blk


@implements("zero_block")
def zero_block(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
               position: str = "interleave"):
    """Exact depth growth: insert L1-L0 blocks whose writers (attn c_proj, mlp c_proj, with biases) are 0.

    A new block is a copy of the source block it follows (so its LN/Q/K/V/fc weights are trained
    ones and its zero writers get non-zero gradients at step 1), except the writers. Uses the first
    member. Options: position = "interleave" (default: new blocks spread evenly, each after a source
    block) or "top" (all after the last block).
    """
    model = models[0]
    s = ModelShape.of(_core(model))
    OPERATORS["zero_block"].check(s, 1, n_embd, n_layer, n_head)
    plan = insertion_plan(s.L, n_layer, position)
    src = unpack(_core(model))["blocks"]
    nb = neighbour_of(plan)
    blocks = [src[p] if p is not None else _zero_writers(src[nb[i]]) for i, p in enumerate(plan)]
    return _rebuild(model, blocks, plan)


@implements("stack")
def stack(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0):
    """G_stack (Du et al. 2024): repeat the whole block list, target block i = source block i mod L0.

    Not function-preserving (each repeated pre-LN block adds its update again). Uses the first member.
    """
    model = models[0]
    s = ModelShape.of(_core(model))
    src = unpack(_core(model))["blocks"]
    block_map = [i % s.L for i in range(n_layer)]
    return _rebuild(model, [src[j] for j in block_map], block_map)


@implements("interleave")
def interleave(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0):
    """Duplicate blocks in place, 1,1,2,2,... (target block i = source block floor(i L0 / L1)).

    Not function-preserving. Uses the first member.
    """
    model = models[0]
    s = ModelShape.of(_core(model))
    src = unpack(_core(model))["blocks"]
    block_map = [i * s.L // n_layer for i in range(n_layer)]
    return _rebuild(model, [src[j] for j in block_map], block_map)


@implements("stack_members")
def stack_members(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
                  embed: str = "mean"):
    """Depth combination of the n members at width d0: m_1's blocks, then m_2's, ..., then m_n's.

    Not function-preserving (the members' residual bases are unrelated). Options: embed = "mean"
    (default: wte, wpe, ln_f and an untied lm_head are the members' average) or "first" (wte and wpe
    from m_1, whose blocks come first; ln_f and an untied lm_head from m_n, whose blocks come last).
    """
    if embed not in ("mean", "first"):
        raise GrowlmError(f"stack_members: embed must be 'mean' or 'first', not {embed!r}")
    Ws = [unpack(m) for m in models]
    s = ModelShape.of(models[0])
    OPERATORS["stack_members"].check(s, len(models), n_embd, n_layer, n_head)
    out = dict(Ws[0])
    if embed == "mean":
        for k in ("wte", "wpe", "lnf_w", "lnf_b", "head"):
            out[k] = None if Ws[0][k] is None else torch.stack([W[k] for W in Ws]).mean(0)
    else:
        for k in ("lnf_w", "lnf_b", "head"):
            out[k] = Ws[-1][k]
    out["blocks"] = [b for W in Ws for b in W["blocks"]]
    return pack(out, target_config(models[0].config, n_embd=s.d, n_layer=n_layer, n_head=s.h))
