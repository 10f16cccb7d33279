"""Net2Net (Chen et al. 2016) and bert2BERT's FPI / AKI (Chen et al. 2022) for a pre-LN GPT-2.

Width (all three): a unit map g: new unit j < d0 is unit j, every further unit copies a random
source unit (mapping="random", the papers' choice) or unit j mod d0 (mapping="cyclic"); applied to
the residual coordinates, to whole heads (head size kept) and to MLP units. Incoming weights are
copied, each copy's outgoing (reader) weights are the source's divided by its copy count (with
optional zero-sum noise); embeddings and LN parameters are copied; with a tied unembedding the
final LN is divided by the copy count per coordinate.

Exactness: heads and MLP units are exact for any copy counts (no normalisation inside), but a
residual stream with *uneven* copy counts changes the LayerNorm statistics, so the result is not
function-preserving in general (bert2BERT: "almost"); it is exact when d1 is a multiple of d0 and
mapping="cyclic" (then it equals HyperCloning). Registered as not exact.

Llama family: the same, with RMSNorm (uneven copies change the mean square as they change LayerNorm's
statistics: exact only with mapping="cyclic" and d1 a multiple of d0), heads mapped in whole groups
of r query heads with their key/value head (a group copies a random source group; a width whose heads
are not whole groups duplicates key/value heads instead: `growlm.growth.width.regrouped_heads`), and
the gated MLP's gate columns copied with the up columns.

Depth: Net2Net is width only (chain 'zero_block' for its identity-layer deepening). FPI and AKI
stack the widened block list (123123, bert2BERT's default). AKI additionally takes the new output
units of layer l (new residual coordinates written by its c_proj's, new heads' Q/K/V, new MLP
units) from layer l+1 (the top layer keeps its own): deliberately not function-preserving, and it
breaks the symmetry of the copies.
"""

from __future__ import annotations

import torch

from growlm.errors import GrowlmError
from growlm.growth.algebra import generator, mlp_width, pack, target_config, unpack
from growlm.growth.registry import implements
from growlm.growth.width import WidthEngine, WidthPlan, regrouped_heads
from growlm.methods import check_heads
from growlm.shape import ModelShape, regrouped_r


def _map(size0: int, size1: int, mapping: str, gen: torch.Generator) -> torch.Tensor:
    if mapping == "cyclic":
        return torch.arange(size1) % size0
    if mapping == "random":
        return torch.cat([torch.arange(size0), torch.randint(0, size0, (size1 - size0,), generator=gen)])
    raise GrowlmError(f"mapping must be 'random' or 'cyclic', not {mapping!r}")


def _widen(model, n_embd: int, *, seed: int, noise: float, mapping: str, name: str):
    s = ModelShape.of(model)
    h1 = check_heads(s, n_embd, None, name, regroup=True)
    f1 = mlp_width(model.config, n_embd) or 4 * n_embd
    gen = generator(seed)
    z = lambda k: torch.zeros(k, dtype=torch.long)  # noqa: E731
    res_map = _map(s.d, n_embd, mapping, gen)
    r_new = None
    if h1 % s.r:  # not whole groups: key/value heads duplicated, the groups left over copy random groups
        r_new = regrouped_r(1, s.h, s.r, h1)
        left = h1 // r_new - s.g * -(-s.r // r_new)
        extra = _map(s.g, s.g + left, mapping, gen)[s.g:]
        _, head_map, r_new = regrouped_heads(1, s.h, s.r, h1, extra=extra)
    else:
        groups = _map(s.g, h1 // s.r, mapping, gen)  # whole groups of r query heads (r = 1: the heads)
        head_map = (groups[:, None] * s.r + torch.arange(s.r)[None, :]).reshape(-1)
    plan = WidthPlan(1, z(n_embd), res_map, z(h1), head_map, z(f1), _map(s.f, f1, mapping, gen), r_new)
    if noise < 0:
        raise GrowlmError(f"{name}: noise must be >= 0")
    W = WidthEngine([unpack(model)], s, plan, gen=gen, noise=float(noise), noise_mode="centered").grow()
    return W, target_config(model.config, n_embd=n_embd, n_layer=s.L, n_head=h1, n_kv_head=h1 // (r_new or s.r)), s


def _stack_blocks(blocks: list[dict], n_layer: int) -> list[dict]:
    return [blocks[i % len(blocks)] for i in range(n_layer)]


@implements("net2net")
def net2net(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
            noise: float = 0.0, mapping: str = "random"):
    """Net2WiderNet on residual coordinates, heads and MLP units. Uses the first member.

    Options: noise (default 0; zero-sum noise on the split copies, relative std), mapping
    ("random" default, or "cyclic": exact when d1 is a multiple of d0).
    """
    W, config, _ = _widen(models[0], n_embd, seed=seed, noise=noise, mapping=mapping, name="net2net")
    return pack(W, config)


@implements("fpi")
def fpi(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
        noise: float = 0.0, mapping: str = "random"):
    """bert2BERT function-preserving initialisation: Net2Net width, then stacking (123123) for depth.

    Uses the first member. Options as net2net. Not exact (uneven copies; stacking).
    """
    W, config, _ = _widen(models[0], n_embd, seed=seed, noise=noise, mapping=mapping, name="fpi")
    W = {**W, "blocks": _stack_blocks(W["blocks"], n_layer)}
    return pack(W, target_config(config, n_embd=n_embd, n_layer=n_layer, n_head=ModelShape.of(config).h))


@implements("aki")
def aki(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
        noise: float = 0.0, mapping: str = "random"):
    """bert2BERT advanced knowledge initialisation: FPI, but new output units of layer l come from
    layer l+1 (not function-preserving by design), then stacking for depth. Uses the first member.
    """
    W, config, s = _widen(models[0], n_embd, seed=seed, noise=noise, mapping=mapping, name="aki")
    big = ModelShape.of(config)
    new = {"res": torch.arange(n_embd) >= s.d, "hc": torch.arange(n_embd) >= s.h * s.dh,
           "kvc": torch.arange(big.g * big.dh) >= s.g * s.dh, "mlp": torch.arange(big.f) >= s.f}
    outputs = {"q": "hc", "k": "kvc", "v": "kvc", "o": "res", "pr": "res", "fc": "mlp", "gate": "mlp"}
    fpi_blocks = W["blocks"]
    blocks = []
    for l, blk in enumerate(fpi_blocks):
        if l + 1 >= len(fpi_blocks):
            blocks.append(blk)
            continue
        nxt, b = fpi_blocks[l + 1], {k: None if v is None else v.clone() for k, v in blk.items()}
        for p, axis in outputs.items():  # the new output units of layer l come from layer l + 1
            cols = new[axis]
            if b[p + "_w"] is not None:
                b[p + "_w"][:, cols] = nxt[p + "_w"][:, cols]
            if b[p + "_b"] is not None:
                b[p + "_b"][cols] = nxt[p + "_b"][cols]
        blocks.append(b)
    W = {**W, "blocks": _stack_blocks(blocks, n_layer)}
    return pack(W, target_config(config, n_embd=n_embd, n_layer=n_layer, n_head=big.h))
