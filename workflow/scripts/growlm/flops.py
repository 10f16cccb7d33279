"""The one FLOPs formula used by training, the ledger and the report.

For a GPT-2 of width d, depth L, MLP width f (4d), vocabulary V and context T, the matrix
multiplies of one forward pass cost, per token,

    2 * N_mm + 4 * L * T * d,   N_mm = L * (4 d^2 + 2 d f) + V d

(`N_mm` counts the weights of c_attn (3d^2), attn c_proj (d^2), mlp c_fc and c_proj (2 d f) and the
LM head (V d); the second term is q k^T and attention-times-v over the full T x T score matrix, as
the SDPA kernel computes it). Training (forward + backward) costs three times that:

    train_flops_per_token = 6 * N_mm + 12 * L * T * d.

Biases, LayerNorm, GELU, softmax and the embedding lookup are left out (they are < 1% at these
sizes). `tests/test_flops.py` checks the formula against `torch.utils.flop_counter.FlopCounterMode`,
which counts the same matrix multiplies. Evaluation passes are not counted as training cost.

The Llama family differs in two matrices (growlm.shape): its MLP is gated (gate and up projections,
then down: 3 d f weights instead of 2 d f) and its key/value projections have g key/value heads of
size dh (grouped-query attention: 2 d g dh weights instead of 2 d^2), so

    N_mm = L * (2 d^2 + 2 d g dh + 3 d f) + V d.

The attention scores are computed for all h query heads either way (the key/value heads are
repeated), so their term is the same. Rotary embeddings, RMSNorm and SiLU are elementwise and left
out like GELU.
"""

from __future__ import annotations

from growlm.shape import ModelShape


def matmul_params(*, n_embd: int, n_layer: int, vocab_size: int, n_inner: int | None = None, gated: bool = False,
                  kv_share: float = 1.0) -> int:
    """Matrix weights a token passes through: `gated`, a gated MLP (three d x f matrices);
    `kv_share`, the key/value heads per query head (g / h; 1 without grouped-query attention)."""
    f = n_inner or 4 * n_embd
    d = n_embd
    attention = 2 * d * d + int(round(2 * d * d * kv_share))
    return n_layer * (attention + (3 if gated else 2) * d * f) + vocab_size * d


def forward_flops_per_token(*, n_embd: int, n_layer: int, vocab_size: int, context: int,
                            n_inner: int | None = None, gated: bool = False, kv_share: float = 1.0) -> int:
    n_mm = matmul_params(n_embd=n_embd, n_layer=n_layer, vocab_size=vocab_size, n_inner=n_inner, gated=gated,
                         kv_share=kv_share)
    return 2 * n_mm + 4 * n_layer * context * n_embd


def train_flops_per_token(*, n_embd: int, n_layer: int, vocab_size: int, context: int,
                          n_inner: int | None = None, gated: bool = False, kv_share: float = 1.0) -> int:
    return 3 * forward_flops_per_token(n_embd=n_embd, n_layer=n_layer, vocab_size=vocab_size,
                                       context=context, n_inner=n_inner, gated=gated, kv_share=kv_share)


def shape_flops(shape) -> dict:
    """The keyword arguments of the formulas for a `growlm.shape.ModelShape` (any family)."""
    return dict(n_embd=shape.d, n_layer=shape.L, vocab_size=shape.V, n_inner=shape.f, gated=shape.gated,
                kv_share=shape.g / shape.h)


def model_train_flops_per_token(config, context: int) -> int:
    """The formula for a model's config (GPT2Config, LlamaConfig) or a model."""
    return train_flops_per_token(context=context, **shape_flops(ModelShape.of(config)))


def model_forward_flops_per_token(config, context: int) -> int:
    return forward_flops_per_token(context=context, **shape_flops(ModelShape.of(config)))
