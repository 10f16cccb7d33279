"""The Multi-Level V-cycle (Zou et al., ICLR 2024): a schedule that reuses no small model.

M_0's own initialisation is coalesced into a model `factor` times narrower and shallower, that
model is trained on level 1 (its FLOPs are the growth cost; `growlm.jobs.grow.vcycle` runs it
through the runner), de-coalesced back to M_0's shape and interpolated with the initialisation;
the refinement trains on from there. The maps:

* `coalesce(model, n_embd=, n_layer=)`: a smaller model. Width by an integer factor k = d / n_embd:
  the coordinate groups {j, j + d_s, j + 2 d_s, ...} (d_s = n_embd) are merged (Multi-Level pairs
  j with j + d/2 for k = 2); at head granularity the heads {h, h + H_s, ...} and for the MLP the
  units {u, u + f_s, ...} likewise. Output axes (and biases, LN parameters, embeddings) are
  AVERAGED over a group, input axes are SUMMED (a reader whose inputs were copies of one
  coordinate sees their sum); with a tied head the final LN is multiplied by k. Depth by an
  integer factor r = L / n_layer: every run of r consecutive blocks is averaged (adjacent pairs
  for r = 2).
* `decoalesce(model, n_embd=, n_layer=)`: the normalised transpose, i.e. copies: width by tiling
  (= hyperclone without noise, exact) and depth by repeating each block r times (1,1,2,2,...; not
  exact in a pre-LN model). `coalesce(decoalesce(m))` returns m's weights exactly (a left inverse;
  note the paper's code instead rescales GPT-2 embeddings by 2 and 0.5 around its averaging maps).
* `interpolate(large, small, alpha=0.5)`: theta = (1 - alpha) theta_large + alpha decoalesce(theta_small)
  in the large model's shape (alpha = 0.5 is the paper's GPT-2 setting); breaks symmetry and is
  not function-preserving on purpose.
"""

from __future__ import annotations

import torch

from growlm.errors import GrowlmError
from growlm.growth.clone import hyperclone
from growlm.growth.common import pack, state_dict_of, target_config, unpack
from growlm.growth.depth import interleave
from growlm.shape import ModelShape

__all__ = ["coalesce", "decoalesce", "interpolate"]


def _factor(big: int, small: int, what: str) -> int:
    if small <= 0 or big % small:
        raise GrowlmError(f"{what} {big} is not a multiple of {small}")
    return big // small


def _co_matrix(W: torch.Tensor, k_in: int, k_out: int) -> torch.Tensor:
    a, b = W.shape
    return W.reshape(k_in, a // k_in, k_out, b // k_out).sum(0).mean(1)


def _co_vec(v: torch.Tensor, k: int) -> torch.Tensor:
    return v.reshape(k, -1).mean(0)


def coalesce(model: torch.nn.Module, *, n_embd: int, n_layer: int) -> torch.nn.Module:
    """Merge neighbouring coordinate/head/unit groups and runs of blocks (see the module docstring)."""
    s = ModelShape.of(model)
    k = _factor(s.d, n_embd, "width")
    r = _factor(s.L, n_layer, "depth")
    if s.h % k:
        raise GrowlmError(f"{s.h} heads cannot be merged in groups of {k}")
    if s.g % k:
        raise GrowlmError(f"{s.g} key/value heads cannot be merged in groups of {k}")
    W = unpack(model)
    blocks = []
    for l in range(n_layer):
        group = W["blocks"][l * r:(l + 1) * r]
        avg = {key: None if group[0][key] is None else torch.stack([b[key] for b in group]).mean(0)
               for key in group[0]}
        blk = {}
        for key in ("ln1_w", "ln1_b", "ln2_w", "ln2_b", "o_b", "pr_b", "q_b", "k_b", "v_b", "fc_b", "gate_b"):
            blk[key] = None if avg[key] is None else _co_vec(avg[key], k)
        for key in ("q_w", "k_w", "v_w", "o_w", "fc_w", "gate_w", "pr_w"):
            blk[key] = None if avg[key] is None else _co_matrix(avg[key], k, k)
        blocks.append(blk)
    V = W["wte"].shape[0]
    out = {"wte": W["wte"].reshape(V, k, -1).mean(1),
           "wpe": None if W["wpe"] is None else W["wpe"].reshape(W["wpe"].shape[0], k, -1).mean(1),
           "lnf_w": _co_vec(W["lnf_w"], k), "lnf_b": None if W["lnf_b"] is None else _co_vec(W["lnf_b"], k),
           "blocks": blocks, "head": None}
    if W["head"] is None:
        out["lnf_w"] = out["lnf_w"] * k
        out["lnf_b"] = None if out["lnf_b"] is None else out["lnf_b"] * k
    else:
        out["head"] = W["head"].reshape(V, k, -1).sum(1)
    return pack(out, target_config(model.config, n_embd=n_embd, n_layer=n_layer, n_head=s.h // k))


def decoalesce(model: torch.nn.Module, *, n_embd: int, n_layer: int) -> torch.nn.Module:
    """Copy back up: tile the width (exact), repeat every block (see the module docstring)."""
    s = ModelShape.of(model)
    _factor(n_embd, s.d, "width")
    _factor(n_layer, s.L, "depth")
    wide = hyperclone([model], n_embd=n_embd, n_layer=s.L) if n_embd != s.d else model
    return interleave([wide], n_embd=n_embd, n_layer=n_layer) if n_layer != s.L else wide


def interpolate(large: torch.nn.Module, small: torch.nn.Module, alpha: float = 0.5) -> torch.nn.Module:
    """(1 - alpha) * large + alpha * decoalesce(small), parameter by parameter, in large's shape."""
    if not 0.0 <= alpha <= 1.0:
        raise GrowlmError(f"alpha must be in [0, 1], not {alpha}")
    c = large.config
    s = ModelShape.of(large)
    up = decoalesce(small, n_embd=s.d, n_layer=s.L)
    a, b = state_dict_of(unpack(large), c), state_dict_of(unpack(up), up.config)
    if a.keys() != b.keys():
        raise GrowlmError("the small and the large model differ in head tying")
    mixed = {key: (1 - alpha) * a[key] + alpha * b[key].to(a[key].dtype) for key in a}
    W = unpack(large)
    out = pack(W, c)  # a copy in large's config, then overwrite
    out.load_state_dict({k: v for k, v in mixed.items()}, strict=False)
    return out
