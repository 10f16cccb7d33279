"""Shared machinery of the growth operators: a model's weights in the family-neutral form, configs of
the grown model, depth plans, and small helpers (ramps, seeded generators).

Weights are handled in the weight form of `growlm.families` (`unpack` / `pack` dispatch on the
model's family, GPT-2 or Llama)::

    {"wte": (V, d), "wpe": (T, d) | None, "lnf_w": (d,), "lnf_b": (d,) | None, "head": (V, d) | None (tied),
     "blocks": [{"ln1_w", "ln1_b", "q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w", "o_b", "ln2_w", "ln2_b",
                 "fc_w", "fc_b", "gate_w", "gate_b", "pr_w", "pr_b"}, ...]}

Matrices are (in, out): y = x @ W + b; a part a family does not have is None (no position table
under rotary positions, no norm bias under RMSNorm, no gate in a plain MLP, no biases in Llama).
Output channel i dh + e of q is channel e of query head i; k and v have g key/value heads, and
query head i reads key/value head i // r (r = h / g; GPT-2: r = 1).

The width engine, which grows these weights for n members at once, is `growlm.growth.width`: it reads
the weight form by its keys and imports nothing from here, so it stands beside this module, not on it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from growlm.errors import GrowlmError
from growlm.families import BLOCK_KEYS, WRITER_KEYS, family_of  # noqa: F401 (the operators' toolbox)
from growlm.loading import load_into  # noqa: F401 (the operators' toolbox)
from growlm.shape import ModelShape


# ----------------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------------

def mlp_width(config, n_embd: int) -> int | None:
    """The MLP width of the grown config: None (= 4 d) if a GPT-2 source uses the default, else
    scaled with the width."""
    s = ModelShape.of(config)
    if s.n_inner is None:
        return None
    return int(round(s.n_inner * n_embd / s.d))


def target_config(src, *, n_embd: int, n_layer: int, n_head: int, n_inner: int | None | str = "same",
                  eps: float | None = None, n_kv_head: int | None = None):
    """A copy of the config `src` (any family) with a new width/depth/head count (key/value heads
    follow the query heads unless `n_kv_head` says how many: `regrouped_heads`), optionally a new MLP
    width and norm epsilon."""
    fam = family_of(src)
    s = ModelShape.of(src)
    if n_kv_head is not None and n_head % s.r:  # resize with one key/value head per query head, then set them
        src = fam.config(replace(s, n_kv_head=s.h), like=src)
    out = fam.resized(src, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_inner=n_inner, eps=eps)
    if n_kv_head is not None and n_kv_head != ModelShape.of(out).g:
        out = fam.config(replace(ModelShape.of(out), n_kv_head=n_kv_head), like=out)
    return out


def norm_eps(config) -> float:
    """The epsilon of every norm of a model of `config` (LayerNorm or RMSNorm)."""
    return family_of(config).eps(config)


def init_std(config) -> float:
    """The std of a new weight under the family's initialisation."""
    return family_of(config).init_std(config)


# ----------------------------------------------------------------------------------------------
# model <-> weights
# ----------------------------------------------------------------------------------------------

def unpack(model) -> dict:
    """The weights of a model of either family in the weight form (see the module docstring)."""
    return family_of(model).unpack(model)


def state_dict_of(W: dict, config) -> dict[str, torch.Tensor]:
    """The family's state-dict names for weights `W`."""
    return family_of(config).state_dict(W, config)


def empty_model(config):
    """A model on the meta device (no random initialisation cost)."""
    return family_of(config).empty(config)


def pack(W: dict, config):
    """A plain model with `config` holding weights `W` (in their dtype; a float64 model's norms compute in
    float64: `float64_norms`)."""
    model = family_of(config).pack(W, config)
    if W["wte"].dtype == torch.float64:
        float64_norms(model)
    return model


class RMSNormFloat64(LlamaRMSNorm):
    """transformers' Llama RMSNorm, but computed in float64 for float64 input (transformers computes it
    in float32 whatever the input's dtype: a float64 model is then float32-precise at every norm, 1e-7).
    Any other dtype takes transformers' own forward, so nothing changes there."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype != torch.float64:
            return super().forward(hidden_states)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def float64_norms(model):
    """`model` (changed in place, and returned) with every Llama RMSNorm computed in float64 for float64
    input (`RMSNormFloat64`; the weights and every other dtype are untouched). Grown float64 models get it
    from `pack`, so they compute their function in float64; give it to a float64 member too to compare
    the two in float64 (tests, bench/smollm_sizes.py)."""
    for module in model.modules():
        if type(module) is LlamaRMSNorm:
            module.__class__ = RMSNormFloat64
    return model


def with_blocks(W: dict, blocks: list[dict]) -> dict:
    return {**W, "blocks": blocks}


def clone_weights(W: dict) -> dict:
    """A deep copy of a weight form (None stays None)."""
    return {k: ([{a: None if b is None else b.clone() for a, b in blk.items()} for blk in v] if k == "blocks"
                else None if v is None else v.clone()) for k, v in W.items()}


# ----------------------------------------------------------------------------------------------
# depth plans
# ----------------------------------------------------------------------------------------------

def insertion_plan(L0: int, L1: int, position: str) -> list[int | None]:
    """Target block list: source block index, or None for an inserted block (after its neighbour).

    "interleave": the L1-L0 new blocks are spread evenly, each after a source block;
    "top": all new blocks after the last source block.
    """
    m = L1 - L0
    if position == "top":
        return list(range(L0)) + [None] * m
    if position != "interleave":
        raise GrowlmError(f"position must be 'interleave' or 'top', not {position!r}")
    out: list[int | None] = []
    for i in range(L0):
        out.append(i)
        out.extend([None] * ((i + 1) * m // L0 - i * m // L0))
    return out


def neighbour_of(plan: list[int | None]) -> list[int]:
    """For each target block, the source block it is or follows (the one below; block 0 if none)."""
    out, last = [], 0
    for p in plan:
        if p is not None:
            last = p
        out.append(last)
    return out


def ramp(step: int, steps: int) -> float:
    """0 at step 0, rising linearly to 1 at `steps` (1 at once when steps <= 0)."""
    if steps <= 0:
        return 1.0
    return min(1.0, max(0.0, step / steps))


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g
