"""MSG: Masked Structural Growth (Yao et al., ICLR 2024).

The source's weights are copied in place (top-left of every grown matrix: old residual
coordinates, old heads and key/value heads, old MLP units first; old blocks at their positions),
every new weight is random (GPT-2's init: N(0, 0.02), writers N(0, 0.02/sqrt(2 L1)), biases 0, new
norm gains 1, biases 0). The outputs of every new unit are multiplied by a mask c ramping 0 -> 1
over `ramp_steps` refine steps: new residual coordinates (embeddings, writers and norm outputs
there), new query heads (before the attention output projection), new MLP units (after the
activation; for a gated MLP after silu(gate) * up), new blocks (x <- x + c Block(x) on both residual
branches); the norm's statistics are mask-weighted over the coordinates. At c = 0 the grown model
computes exactly the source model whatever the new weights are.

In the Llama family the same holds with the masked RMSNorm (the mask-weighted mean square of the
old coordinates is the source's) and grouped-query attention: the old query heads are the first h0
and their key/value heads the first g0, so old query head i still reads old key/value head i // r
(r is kept: h1 = d1 / dh, g1 = h1 / r); new query heads may read old or new key/value heads, but their
outputs are masked. Rotary positions need nothing: the head size is kept, so each old head rotates
as before. A width whose heads are not whole groups of r (6 heads on 2 key/value heads grown to 8)
duplicates key/value heads instead (`growlm.growth.width.regrouped_heads`: there 4 key/value heads,
2 query heads each): each source group's heads take the first positions of its run of query heads,
the new heads the rest, and every key/value head copies its group's, so each old query head reads
a copy of its own key/value head.

Returns a `GrownModel` (see masked.py): growth_step / ramp_done / to_plain.
"""

from __future__ import annotations

import math

import torch

from growlm.errors import GrowlmError
from growlm.growth.algebra import generator, init_std as family_std, insertion_plan, pack, target_config, unpack
from growlm.growth.masked import GrownModel
from growlm.growth.registry import implements
from growlm.growth.width import _occurrence_rank, kv_plan, regrouped_heads
from growlm.methods import check_heads
from growlm.shape import ModelShape


_HEAD_KEYS = ("q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w")  # what `_place_heads` fills


def _regrouped(s: ModelShape, h1: int):
    """Where the source's heads go when h1 is not whole groups of its r query heads per key/value head
    (`growlm.growth.width.regrouped_heads`): (old (h1,) bool: the position holds a source head, the
    source head's channels at those positions, the source key/value channels of every new key/value
    channel). Each source group's heads come first in its run of positions, then new heads."""
    mem, src, r_new = regrouped_heads(1, s.h, s.r, h1)
    old = _occurrence_rank(src) == 0
    e = torch.arange(s.dh)
    pos = old.nonzero().squeeze(1)  # positions of the source heads ...
    order = src[pos]  # ... and which source head each is
    q_new = (pos[:, None] * s.dh + e).reshape(-1)
    q_old = (order[:, None] * s.dh + e).reshape(-1)
    _, kv_src = kv_plan(mem, src, s.r, r_new)
    kv_old = (kv_src[:, None] * s.dh + e).reshape(-1)
    return old, q_new, q_old, kv_old


def _place_heads(blk: dict, ob: dict, regroup, d0: int) -> None:
    """Copy a source block's attention weights into `blk` at the regrouped head positions: each source
    query head's q columns and o rows at its position, every key/value head a copy of its source group's
    (rows of new residual coordinates stay random: the norm's output there is masked to 0)."""
    _, q_new, q_old, kv_old = regroup
    blk["q_w"][:d0, q_new] = ob["q_w"][:, q_old]
    blk["o_w"][q_new, :d0] = ob["o_w"][q_old, :]
    if blk["q_b"] is not None:
        blk["q_b"][q_new] = ob["q_b"][q_old]
    for k in ("k", "v"):
        blk[k + "_w"][:d0, :] = ob[k + "_w"][:, kv_old]
        if blk[k + "_b"] is not None:
            blk[k + "_b"][:] = ob[k + "_b"][kv_old]


def _embed(big: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    big = big.clone()
    big[tuple(slice(0, k) for k in old.shape)] = old
    return big


@implements("msg")
def msg(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
        ramp_steps: int = 100, position: str = "interleave", init_std: float | None = None):
    """Masked structural growth of width and depth; exact at step 0. Uses the first member.

    Options: ramp_steps (default 100; refine steps over which the masks go 0 -> 1), position
    ("interleave" or "top") for new blocks, init_std (std of new weights; default the config's
    initializer_range).
    """
    if ramp_steps < 0:
        raise GrowlmError("msg: ramp_steps must be >= 0")
    src = models[0]
    s = ModelShape.of(src)
    h1 = check_heads(s, n_embd, n_head, "msg", regroup=True)
    big = s.resized(n_embd=n_embd, n_layer=n_layer, n_head=h1)
    regroup = _regrouped(s, h1) if h1 % s.r else None
    old = unpack(src)
    dtype = old["wte"].dtype
    std = float(init_std if init_std is not None else family_std(src.config))
    std_w = std / math.sqrt(2 * n_layer)
    gen = generator(seed)

    def rnd(*shape, sd=std):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * sd).to(dtype)

    def zeros(k):
        return torch.zeros(k, dtype=dtype)

    def ones(k):
        return torch.ones(k, dtype=dtype)

    d1, f1, kv1 = n_embd, big.f, big.g * big.dh
    like = old["blocks"][0]  # which parts the family has (None: no such bias, no gate)

    def new_block():
        # the draw order is GPT-2's (q, k, v, o, fc, pr), so a GPT-2 grows as it always did
        blk = {"ln1_w": ones(d1), "ln1_b": zeros(d1), "q_w": rnd(d1, d1), "q_b": zeros(d1),
               "k_w": rnd(d1, kv1), "k_b": zeros(kv1), "v_w": rnd(d1, kv1), "v_b": zeros(kv1),
               "o_w": rnd(d1, d1, sd=std_w), "o_b": zeros(d1), "ln2_w": ones(d1),
               "ln2_b": zeros(d1), "fc_w": rnd(d1, f1), "fc_b": zeros(f1),
               "pr_w": rnd(f1, d1, sd=std_w), "pr_b": zeros(d1)}
        blk["gate_w"], blk["gate_b"] = (rnd(d1, f1), zeros(f1)) if like["gate_w"] is not None else (None, None)
        return {k: None if like[k] is None else v for k, v in blk.items()}

    plan = insertion_plan(s.L, n_layer, position)
    blocks = []
    for p in plan:
        blk = new_block()
        if p is not None:
            heads = _HEAD_KEYS if regroup is not None else ()
            ob = old["blocks"][p]
            blk = {k: None if v is None else v if k in heads else _embed(v, ob[k]) for k, v in blk.items()}
            if regroup is not None:
                _place_heads(blk, ob, regroup, s.d)
        blocks.append(blk)
    W = {"wte": _embed(rnd(s.V, n_embd), old["wte"]),
         "wpe": None if old["wpe"] is None else _embed(rnd(s.T, n_embd), old["wpe"]),
         "lnf_w": _embed(ones(n_embd), old["lnf_w"]),
         "lnf_b": None if old["lnf_b"] is None else _embed(zeros(n_embd), old["lnf_b"]),
         "head": None if old["head"] is None else _embed(rnd(s.V, n_embd), old["head"]), "blocks": blocks}
    core = pack(W, target_config(src.config, n_embd=n_embd, n_layer=n_layer, n_head=h1, n_kv_head=big.g))
    if ramp_steps == 0 or (n_embd == s.d and n_layer == s.L):
        return core
    f = lambda k, k0: (torch.arange(k) >= k0).to(dtype)  # noqa: E731
    head_new = f(h1, s.h) if regroup is None else (~regroup[0]).to(dtype)
    bufs = {"res_new": f(n_embd, s.d), "head_new": head_new, "mlp_new": f(f1, s.f),
            "block_new": torch.tensor([0.0 if p is not None else 1.0 for p in plan], dtype=dtype)}
    return GrownModel(core, {"kind": "msg", "ramp_steps": int(ramp_steps)}, bufs)
