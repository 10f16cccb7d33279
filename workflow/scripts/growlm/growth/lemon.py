"""LEMON (Wang et al., ICLR 2024): exact width growth to any d1 >= d0, and exact depth growth.

Width: the residual stream becomes k = d1 // d0 tiled copies of the source coordinates plus
r = d1 - k d0 residue coordinates that each hold mean(x) ("mean padding"): writers' residue
columns are the row mean of their source columns, embeddings' residue columns the row mean.
Then the mean of the grown residual is unchanged and its variance is s = k d0 / d1 times the
source's, so LayerNorm stays exact with gamma' = sqrt(s) * tiled gamma, beta' = tiled beta (0 on the
residue) and eps' = s * eps. HF GPT-2 has one `layer_norm_epsilon` for every LN, and every LN
reads the residual stream, so the new eps applies to all of them (the returned config has it).
Heads are copied circularly (head size kept), MLP units circularly. Readers' input rows split
each source row over its copies *unequally* (1/count plus noise that sums to zero over the
copies), which breaks the symmetry of the copies while staying exact; readers' residue rows are
random (the LN output there is exactly 0). The final LN (tied head) is divided by k; an untied
lm_head has its copied columns divided by k instead.

Depth (L1 > L0): new blocks whose writers (attn and MLP c_proj, with biases) are zero, so each is
an identity at step 0; their other weights are copied from the next source block (AKI-style, the
last block for blocks on top).

Llama family (RMSNorm subtracts no mean): the mean-padded residue would add mean(x)^2 to the mean
square and break the norm, so there the residue coordinates hold 0 instead (writers' and embeddings'
residue columns zero). The mean square of the grown residual is then s = k d0 / d1 times the
source's, and RMSNorm stays exact with gamma' = sqrt(s) * tiled gamma and eps' = s * eps: the same
rescaling as LayerNorm's, for the same reason (the normaliser scales by sqrt(s)). Heads are copied
in whole groups of r query heads with their key/value head (`growlm.growth.width.kv_plan`); a width
whose heads are not whole groups of r gets duplicated key/value heads instead, fewer query heads per
key/value head (`growlm.growth.width.regrouped_heads`: 6 heads on 2 key/value heads grown to 8 give
4 key/value heads, each source key/value head twice), still exact.
"""

from __future__ import annotations

import torch

from growlm.errors import GrowlmError
from growlm.growth.algebra import (WRITER_KEYS, generator, insertion_plan, mlp_width, norm_eps, pack, target_config,
                                  unpack)
from growlm.growth.registry import implements
from growlm.growth.width import WidthEngine, tile_plan
from growlm.methods import check_heads
from growlm.shape import ModelShape


def h1_of(config) -> int:
    return ModelShape.of(config).h


def widen(model, n_embd: int, *, seed: int, noise: float, residue_std: float):
    """LEMON width expansion of one model (weights dict, config)."""
    s = ModelShape.of(model)
    h1 = check_heads(s, n_embd, None, "lemon", regroup=True)
    f1 = mlp_width(model.config, n_embd) or 4 * n_embd
    plan = tile_plan(1, s.d, s.h, s.f, n_embd, h1, f1, r=s.r)
    eng = WidthEngine([unpack(model)], s, plan, gen=generator(seed), noise=noise, noise_mode="centered",
                      residue_std=residue_std)
    W = eng.grow()
    eps = float(eng.group_eps(norm_eps(model.config))[0])
    return W, target_config(model.config, n_embd=n_embd, n_layer=s.L, n_head=h1, eps=eps,
                            n_kv_head=h1 // (plan.r or s.r))


def deepen_zero(blocks: list[dict], n_layer: int, position: str) -> list[dict]:
    """Insert zero-writer blocks; a new block copies the next source block (or the last one)."""
    L0 = len(blocks)
    plan = insertion_plan(L0, n_layer, position)
    out, last = [], 0
    for p in plan:
        if p is not None:
            out.append(blocks[p])
            last = p
        else:
            src = blocks[min(last + 1, L0 - 1)]
            blk = {k: None if v is None else v.clone() for k, v in src.items()}
            for k in WRITER_KEYS:
                blk[k] = None if blk[k] is None else torch.zeros_like(blk[k])
            out.append(blk)
    return out


@implements("lemon")
def lemon(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
          noise: float = 0.1, residue_std: float = 0.02, position: str = "interleave"):
    """LEMON: exact width growth to any d1 (multiple of the head size) and zero-writer depth growth.

    Uses the first member. Options: noise (default 0.1; std of the zero-sum split noise on readers'
    copies, relative to each matrix's std; 0 = equal 1/k split), residue_std (default 0.02; std of
    readers' random residue rows), position ("interleave" or "top") for new blocks.
    """
    if noise < 0 or residue_std < 0:
        raise GrowlmError("lemon: noise and residue_std must be >= 0")
    src = models[0]
    s = ModelShape.of(src)
    check_heads(s, n_embd, n_head, "lemon", regroup=True)
    if position not in ("interleave", "top"):
        raise GrowlmError(f"lemon: position must be 'interleave' or 'top', not {position!r}")
    W, config = widen(src, n_embd, seed=seed, noise=float(noise), residue_std=float(residue_std))
    if n_layer > s.L:
        W = {**W, "blocks": deepen_zero(W["blocks"], n_layer, position)}
        config = target_config(config, n_embd=n_embd, n_layer=n_layer, n_head=h1_of(config), n_inner="same")
    return pack(W, config)
