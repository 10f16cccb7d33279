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
"""

from __future__ import annotations


def matmul_params(*, n_embd: int, n_layer: int, vocab_size: int, n_inner: int | None = None) -> int:
    f = n_inner or 4 * n_embd
    d = n_embd
    return n_layer * (4 * d * d + 2 * d * f) + vocab_size * d


def forward_flops_per_token(*, n_embd: int, n_layer: int, vocab_size: int, context: int,
                            n_inner: int | None = None) -> int:
    n_mm = matmul_params(n_embd=n_embd, n_layer=n_layer, vocab_size=vocab_size, n_inner=n_inner)
    return 2 * n_mm + 4 * n_layer * context * n_embd


def train_flops_per_token(*, n_embd: int, n_layer: int, vocab_size: int, context: int,
                          n_inner: int | None = None) -> int:
    return 3 * forward_flops_per_token(n_embd=n_embd, n_layer=n_layer, vocab_size=vocab_size,
                                       context=context, n_inner=n_inner)


def model_train_flops_per_token(config, context: int) -> int:
    """The formula for a `GPT2Config` (or any object with the same attribute names)."""
    return train_flops_per_token(n_embd=config.n_embd, n_layer=config.n_layer,
                                 vocab_size=config.vocab_size, context=context,
                                 n_inner=getattr(config, "n_inner", None))
