"""Block concatenation of n different members (growth-operators.md §3): d1 = n * d0.

The residual stream of the grown model is [x^1; ...; x^n]: embeddings (wte, wpe) concatenated,
every Q/K/V/attn-proj/fc/mlp-proj block-diagonal (member i's heads stay member i's heads, so
h1 = n h0 and the head size is kept; f1 = n f0), biases and LN gamma/beta concatenated; with a
tied unembedding the final LN is divided by n (an untied lm_head is concatenated and divided by
n). With LayerNorm statistics computed per member group, the grown model's logits are exactly the
AVERAGE of the members' logits at step 0. The grouped statistics are faded into full-width LN
over `ln_ramp_steps` refine steps (mu_c = (1-c) mu_group + c mu_all, same for the variance), so
the grown model is a `GrownModel` (see masked.py) until the ramp is done, then `to_plain()`.

In the Llama family the same argument holds with RMSNorm: a member group's mean square is that
member's own, so grouped RMSNorm gives each member's normed residual exactly, and the gated MLP's
units (gate and up columns, down rows) and the key/value heads are block-diagonal like the rest
(member i's key/value heads serve member i's query heads: the query heads per key/value head are
kept, g1 = n g0). Rotary positions act per head and the head size is kept.

Off-diagonal (cross-member) blocks, option `cross`:
* "zero" (default): exactly zero; they get non-zero gradients at step 1.
* "noise": small Gaussian N(0, cross_std) (default cross_std 1e-3), not masked: NOT exact at step 0
  (the logit error grows with cross_std).
* "random": N(0, cross_std) (default cross_std 0.02 = GPT-2's init) multiplied by a mask ramping
  0 -> 1 over `ramp_steps` refine steps: exact at step 0.

Widths that are not n*d0: the chain ["concat", "lemon"] is fused into this operator: member group
m gets D_m = d1/n (+-1) coordinates, k_m = D_m // d0 tiled copies of member m's coordinates and
D_m - k_m d0 LEMON residue coordinates (mean padding), with gamma * sqrt(s_m) and a per-group
eps_m = s_m eps (the group LN uses it; the full-width LN after the ramp uses the mean eps); extra
heads / MLP units are circular copies over (member, unit) with the readers split over the copies.
Still exact (the members' logit average) at step 0; options `noise` and `residue_std` as lemon.

With n = 1 (or ln_ramp_steps = 0 and no masked cross blocks) a plain GPT2LMHeadModel is returned
(for ln_ramp_steps = 0 and n > 1: full-width LN from the start, not exact).
"""

from __future__ import annotations

import torch

from growlm.errors import GrowlmError
from growlm.growth.algebra import generator, mlp_width, norm_eps, pack, target_config, unpack
from growlm.growth.masked import GrownModel
from growlm.growth.registry import implements
from growlm.growth.width import WidthEngine, tile_plan
from growlm.methods import OPERATORS
from growlm.shape import ModelShape


@implements("concat")
def concat(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
           cross: str = "zero", cross_std: float | None = None, ramp_steps: int = 100,
           ln_ramp_steps: int = 100, noise: float = 0.1, residue_std: float = 0.02, absorbed=()):
    """n members side by side (block-diagonal), exact as the members' logit average at step 0.

    Options: cross ("zero" | "noise" | "random"), cross_std, ramp_steps (cross-block mask ramp,
    for cross="random"), ln_ramp_steps (grouped -> full LN), and for the fused ['concat', 'lemon']
    chain noise / residue_std (as lemon).
    """
    if cross not in ("zero", "noise", "random"):
        raise GrowlmError(f"concat: cross must be 'zero', 'noise' or 'random', not {cross!r}")
    if ramp_steps < 0 or ln_ramp_steps < 0:
        raise GrowlmError("concat: ramp_steps and ln_ramp_steps must be >= 0")
    n = len(models)
    s = ModelShape.of(models[0])
    OPERATORS["concat"].check(s, n, n_embd, n_layer, n_head, absorbed)
    h1 = n_embd // s.dh
    f1 = mlp_width(models[0].config, n_embd) or 4 * n_embd
    plan = tile_plan(n, s.d, s.h, s.f, n_embd, h1, f1, r=s.r)
    gen = generator(seed)
    eng = WidthEngine([unpack(m) for m in models], s, plan, gen=gen, noise=float(noise), noise_mode="centered",
                      residue_std=float(residue_std))
    W = eng.grow()
    group_eps = eng.group_eps(norm_eps(models[0].config))
    eps_target = float(group_eps.mean())
    if cross != "zero" and n > 1:
        std = cross_std if cross_std is not None else (1e-3 if cross == "noise" else 0.02)
        hc = plan.head_mem.repeat_interleave(s.dh)
        kvc = plan.head_mem[::s.r].repeat_interleave(s.dh)  # each key/value head is its group's member's
        pats = {"q": (plan.res_mem, hc), "kv": (plan.res_mem, kvc), "o": (hc, plan.res_mem),
                "fc": (plan.res_mem, plan.mlp_mem), "pr": (plan.mlp_mem, plan.res_mem)}
        mats = [("q_w", "q"), ("k_w", "kv"), ("v_w", "kv"), ("o_w", "o"), ("fc_w", "fc"), ("pr_w", "pr")]
        if s.gated:
            mats.append(("gate_w", "fc"))
        for blk in W["blocks"]:
            for keys, pat in mats:
                a, b = pats[pat]
                mask = (a[:, None] != b[None, :]).to(blk[keys].dtype)
                blk[keys] = blk[keys] + torch.randn(mask.shape, generator=gen, dtype=torch.float64).to(
                    blk[keys].dtype) * std * mask
    config = target_config(models[0].config, n_embd=n_embd, n_layer=s.L, n_head=h1, eps=eps_target)
    core = pack(W, config)
    cross_masked = cross == "random" and n > 1
    if n == 1 or (ln_ramp_steps == 0 and not cross_masked):
        return core
    bufs = {"res_group": plan.res_mem, "head_group": plan.head_mem, "mlp_group": plan.mlp_mem,
            "group_eps": group_eps.to(core.dtype)}
    spec = {"kind": "concat", "ramp_steps": int(ramp_steps), "ln_ramp_steps": int(ln_ramp_steps),
            "cross_masked": cross_masked, "n_members": n, "cross": cross}
    return GrownModel(core, spec, bufs)
