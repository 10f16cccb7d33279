"""The FLOPs formula against torch's own counter on the matrix-multiply part."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from growlm.flops import matmul_params, model_train_flops_per_token, train_flops_per_token
from growlm.model import build_model


@pytest.mark.parametrize("d,L,V,T,B", [(32, 1, 300, 16, 2), (64, 2, 512, 32, 3), (96, 3, 1000, 24, 1)])
def test_matmul_flops_match_flop_counter(d, L, V, T, B):
    model = build_model(seed=0, n_embd=d, n_layer=L, vocab_size=V, n_positions=T, head_dim=16 if d % 16 == 0 else 8)
    x = torch.randint(0, V, (B, T))
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=x).logits
        torch.nn.functional.cross_entropy(logits.view(-1, V), x.view(-1)).backward()
    by_op = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    counted_mm = sum(v for k, v in by_op.items() if "mm" in k)  # mm, addmm, bmm
    attention = sum(v for k, v in by_op.items() if "attention" in k)
    tokens = B * T
    assert counted_mm == 6 * matmul_params(n_embd=d, n_layer=L, vocab_size=V) * tokens
    total = model_train_flops_per_token(model.config, T) * tokens
    if attention:  # counted by torch where SDPA's kernel is known to the counter
        assert counted_mm + attention == total
    else:  # our formula adds q k^T and attn v over the full T x T scores
        assert total - counted_mm == 12 * L * T * d * tokens


def test_formula_grows_with_size():
    small = train_flops_per_token(n_embd=64, n_layer=2, vocab_size=4096, context=128)
    large = train_flops_per_token(n_embd=128, n_layer=4, vocab_size=4096, context=128)
    assert large > 2 * small


@pytest.mark.parametrize("d,L,V,T,B,r,ratio", [(32, 1, 300, 16, 2, 2, 3), (64, 2, 512, 32, 3, 4, 3), (48, 2, 400, 24, 1, 1, 2)])
def test_llama_matmul_flops_match_flop_counter(d, L, V, T, B, r, ratio):
    """The gated MLP (three d x f matrices) and grouped-query attention (key/value projections of
    g = h / r heads) in the formula, against torch's counter; the scores are counted for all h heads."""
    from growlm.shape import ModelShape

    model = build_model(seed=0, family="llama", n_embd=d, n_layer=L, vocab_size=V, n_positions=T, head_dim=8,
                        heads_per_kv=r, mlp_ratio=ratio, tie_word_embeddings=False)
    x = torch.randint(0, V, (B, T))
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=x).logits
        torch.nn.functional.cross_entropy(logits.view(-1, V), x.view(-1)).backward()
    by_op = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    counted_mm = sum(v for k, v in by_op.items() if "mm" in k)
    attention = sum(v for k, v in by_op.items() if "attention" in k)
    tokens = B * T
    s = ModelShape.of(model)
    assert (s.gated, s.g, s.f) == (True, d // 8 // r, ratio * d)
    assert counted_mm == 6 * matmul_params(n_embd=d, n_layer=L, vocab_size=V, n_inner=ratio * d, gated=True,
                                           kv_share=1 / r) * tokens
    total = model_train_flops_per_token(model.config, T) * tokens
    if attention:
        assert counted_mm + attention == total
    else:
        assert total - counted_mm == 12 * L * T * d * tokens
