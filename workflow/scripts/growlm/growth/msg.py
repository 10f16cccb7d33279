"""MSG: Masked Structural Growth (Yao et al., ICLR 2024).

The source's weights are copied in place (top-left of every grown matrix: old residual
coordinates, old heads, old MLP units first; old blocks at their positions), every new weight is
random (GPT-2's init: N(0, 0.02), writers N(0, 0.02/sqrt(2 L1)), biases 0, new LN gamma 1 beta 0).
The outputs of every new unit are multiplied by a mask c ramping 0 -> 1 over `ramp_steps` refine
steps: new residual coordinates (embeddings, writers and LN outputs there), new heads (before the
attention c_proj), new MLP units (after the activation), new blocks (x <- x + c Block(x) on both
residual branches); LN statistics are mask-weighted means over the coordinates. At c = 0 the
grown model computes exactly the source model whatever the new weights are.

Returns a `GrownGPT2` (see masked.py): growth_step / ramp_done / to_gpt2.
"""

from __future__ import annotations

import math

import torch

from growlm.errors import GrowlmError
from growlm.growth.common import generator, insertion_plan, mlp_width, pack, target_config, unpack
from growlm.growth.masked import GrownGPT2
from growlm.growth.registry import implements
from growlm.methods import check_heads
from growlm.shape import ModelShape


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
    h1 = check_heads(s, n_embd, n_head, "msg")
    f1 = mlp_width(src.config, n_embd) or 4 * n_embd
    old = unpack(src)
    dtype = old["wte"].dtype
    std = float(init_std if init_std is not None else src.config.initializer_range)
    std_w = std / math.sqrt(2 * n_layer)
    gen = generator(seed)

    def rnd(*shape, sd=std):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * sd).to(dtype)

    def zeros(k):
        return torch.zeros(k, dtype=dtype)

    def ones(k):
        return torch.ones(k, dtype=dtype)

    def new_block():
        return {"ln1_w": ones(n_embd), "ln1_b": zeros(n_embd), "q_w": rnd(n_embd, n_embd), "q_b": zeros(n_embd),
                "k_w": rnd(n_embd, n_embd), "k_b": zeros(n_embd), "v_w": rnd(n_embd, n_embd), "v_b": zeros(n_embd),
                "o_w": rnd(n_embd, n_embd, sd=std_w), "o_b": zeros(n_embd), "ln2_w": ones(n_embd),
                "ln2_b": zeros(n_embd), "fc_w": rnd(n_embd, f1), "fc_b": zeros(f1),
                "pr_w": rnd(f1, n_embd, sd=std_w), "pr_b": zeros(n_embd)}

    plan = insertion_plan(s.L, n_layer, position)
    blocks = []
    for p in plan:
        blk = new_block()
        if p is not None:
            blk = {k: _embed(v, old["blocks"][p][k]) for k, v in blk.items()}
        blocks.append(blk)
    W = {"wte": _embed(rnd(s.V, n_embd), old["wte"]), "wpe": _embed(rnd(s.T, n_embd), old["wpe"]),
         "lnf_w": _embed(ones(n_embd), old["lnf_w"]), "lnf_b": _embed(zeros(n_embd), old["lnf_b"]),
         "head": None if old["head"] is None else _embed(rnd(s.V, n_embd), old["head"]), "blocks": blocks}
    core = pack(W, target_config(src.config, n_embd=n_embd, n_layer=n_layer, n_head=h1))
    if ramp_steps == 0 or (n_embd == s.d and n_layer == s.L):
        return core
    f = lambda k, k0: (torch.arange(k) >= k0).to(dtype)  # noqa: E731
    bufs = {"res_new": f(n_embd, s.d), "head_new": f(h1, s.h), "mlp_new": f(f1, s.f),
            "block_new": torch.tensor([0.0 if p is not None else 1.0 for p in plan], dtype=dtype)}
    return GrownGPT2(core, {"kind": "msg", "ramp_steps": int(ramp_steps)}, bufs)
