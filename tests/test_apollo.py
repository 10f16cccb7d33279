"""The Apollo-style progressive control (growlm.schedules.apollo): stages, exact block duplication, sampled
depth, FLOPs counted at the sampled depth, and a plain GPT-2 at the end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from growlm.errors import GrowlmError
from growlm.flops import train_flops_per_token
from growlm.loss import evaluate
from growlm.model import build_model
from growlm.schedules.apollo import _set_layers, apollo_schedule, depth_probabilities, duplicate, stage_widths

V = 97


def test_stages_and_depth_distribution():
    assert stage_widths(4) == [1, 2, 4]
    assert stage_widths(6) == [1, 2, 4, 6]
    assert stage_widths(1) == [1]
    p = depth_probabilities(4)
    assert abs(p.sum() - 1) < 1e-12 and all(p[i] > p[i + 1] for i in range(3))  # low depths first


def test_duplicating_blocks_keeps_the_full_depth_function():
    m = build_model(seed=0, n_embd=16, n_layer=4, vocab_size=V, n_positions=16, head_dim=8).double().eval()
    unique = torch.nn.ModuleList([m.transformer.h[0], m.transformer.h[2]])  # k = 2 distinct blocks
    x = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
    _set_layers(m, unique, 4)
    with torch.no_grad():
        before = m(input_ids=x).logits
        grown = duplicate(unique, 4, 4)
        _set_layers(m, grown, 4)
        after = m(input_ids=x).logits
    assert float((before - after).abs().max()) < 1e-12
    assert len({id(b) for b in grown}) == 4  # new, separate modules (not views)


def test_schedule_trains_counts_sampled_depth_flops_and_returns_a_plain_gpt2():
    init = build_model(seed=0, n_embd=32, n_layer=4, vocab_size=V, n_positions=32, head_dim=8)
    rng = np.random.default_rng(0)
    # a learnable stream: a repeated random sequence
    tokens = np.tile(rng.integers(0, V, 500), 100).astype(np.uint16)
    before = evaluate(init, tokens[:4096], context=32)["loss"]
    out, s = apollo_schedule(init, tokens, tokens=8 * 32 * 60, lr=3e-3, batch_size=8, context=32, seed=0,
                             stages="equal", log=lambda *_: None)
    assert [st["unique_blocks"] for st in s["stages"]] == [1, 2, 4] and s["steps"] == 60
    per_depth = [8 * 32 * train_flops_per_token(n_embd=32, n_layer=d, vocab_size=V, context=32) for d in (1, 4)]
    assert s["steps"] * per_depth[0] < s["flops"] < s["steps"] * per_depth[1]  # cheaper than full depth
    assert type(out).__name__ == "GPT2LMHeadModel" and len(out.transformer.h) == 4
    assert len({id(b) for b in out.transformer.h}) == 4
    assert out.lm_head.weight.data_ptr() == out.transformer.wte.weight.data_ptr()  # still tied
    after = evaluate(out, tokens[:4096], context=32)["loss"]
    assert after < before - 0.5, (before, after)


def test_the_authors_stages_stop_below_full_depth_with_lengths_in_proportion_to_their_blocks():
    """The authors' GPT-2 script trains 1, 3 and 6 unique layers of 12 for 2, 2 and 6 epochs, then the
    full model: growlm's "authors" stages are those below full depth, each as long as its block count
    says; the full depth is trained by the refinement (the schedule returns it grown to full depth)."""
    from growlm.schedules.apollo import stage_steps

    assert stage_steps(4, 90) == [(1, 30), (2, 60)]
    assert stage_steps(8, 70) == [(1, 10), (2, 20), (4, 40)]
    assert stage_steps(6, 71) == [(1, 10), (2, 20), (4, 41)]  # the rounding goes to the last stage
    assert stage_steps(4, 90, "equal") == [(1, 30), (2, 30), (4, 30)]
    init = build_model(seed=0, n_embd=32, n_layer=4, vocab_size=V, n_positions=32, head_dim=8)
    tokens = np.tile(np.random.default_rng(0).integers(0, V, 500), 100).astype(np.uint16)
    out, s = apollo_schedule(init, tokens, tokens=8 * 32 * 30, lr=3e-3, batch_size=8, context=32, seed=0,
                             log=lambda *_: None)
    assert [(st["unique_blocks"], st["steps"]) for st in s["stages"]] == [(1, 10), (2, 20)]
    blocks = out.transformer.h
    assert len(blocks) == 4 and len({id(b) for b in blocks}) == 4
    # grown to full depth by the interpolation map: layers 0-1 copy unique block 0, layers 2-3 block 1
    for a, b in ((0, 1), (2, 3)):
        assert all(torch.equal(p, q) for p, q in zip(blocks[a].parameters(), blocks[b].parameters()))
    assert not torch.equal(blocks[0].attn.c_attn.weight, blocks[2].attn.c_attn.weight)
    with pytest.raises(GrowlmError, match="fewer steps than the schedule's 2 stages need"):
        apollo_schedule(init, tokens, tokens=8 * 32 * 2, lr=3e-3, batch_size=8, context=32, seed=0,
                        log=lambda *_: None)
