"""Optimizer-state carry-over (growlm.growth.moments): the members' AdamW moments are grown with the
linear part of the operator, saved, and started from by the refinement's AdamW."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from growlm.errors import GrowlmError
from growlm.growth import grow
from growlm.growth.moments import grow_moments
from growlm.model import build_model
from growlm.optim_state import MOMENT_KINDS, apply_moments, load_moments, save_grown_moments
from growlm.train import make_optimizer, train
from growlm.train_config import TrainConfig

V = 61


def member(seed: int, d: int = 16, L: int = 2):
    return build_model(seed=seed, n_embd=d, n_layer=L, vocab_size=V, n_positions=16, head_dim=8).double()


def weights_as_moments(m) -> dict:
    """A member's own weights posing as its moments: then grow_moments gives the operator's linear part."""
    return {name: {kind: p.detach().clone() for kind in MOMENT_KINDS} for name, p in m.named_parameters()}


@pytest.mark.parametrize("method,n,d1,L1,opts", [
    (["hyperclone", "zero_block"], 1, 32, 4, {"noise": 0.2}),
    ("lemon", 1, 24, 3, {}),
    (["net2net", "zero_block"], 1, 32, 3, {}),
    ("msg", 1, 32, 4, {}),
    (["concat", "zero_block"], 2, 32, 3, {"cross": "random"}),
    (["concat", "zero_block"], 3, 48, 2, {}),
    (["hyperclone", "stack"], 1, 32, 4, {}),
])
def test_carried_moments_are_the_linear_part_of_the_operator(method, n, d1, L1, opts):
    """For an affine operator G(theta) = A theta + b (b: the seeded new units), grow_moments(theta) must
    equal G(theta) - G(0) exactly: checked by feeding the weights in as moments."""
    members = [member(seed=i) for i in range(n)]
    carried = grow_moments(members, [weights_as_moments(m) for m in members], method, n_embd=d1, n_layer=L1,
                           seed=5, **opts)
    grown = {k: p.detach() for k, p in grow(members, method, n_embd=d1, n_layer=L1, seed=5, **opts).named_parameters()}
    zeros = [member(seed=i) for i in range(n)]
    for z in zeros:
        for p in z.parameters():
            p.data.zero_()
    offset = {k: p.detach() for k, p in grow(zeros, method, n_embd=d1, n_layer=L1, seed=5, **opts).named_parameters()}
    assert set(carried) == set(grown)
    worst = max(float((carried[k]["exp_avg"] + offset[k] - grown[k]).abs().max()) for k in grown)
    assert worst < 1e-10, worst
    assert all(bool((carried[k]["exp_avg_sq"] >= 0).all()) for k in grown)


def _tiny_run(model, tmp_path, name, **kw):
    tokens = np.random.default_rng(0).integers(0, V, size=20000).astype(np.uint16)
    cfg = TrainConfig(tokens=8 * 16 * 6, batch_size=8, context=16, lr=3e-3, warmup_steps=1, eval_interval=3,
                      eval_tokens=512, checkpoint_every=100, seed=1, **{"dense_log_steps": 0, **kw})
    summary = train(model, tokens, tokens, cfg, ckpt_dir=tmp_path / name / "ckpt",
                    ledger_path=tmp_path / name / "ledger.csv", log=lambda *_: None)
    return summary


def test_member_moments_are_saved_grown_and_applied(tmp_path):
    m = member(seed=0).float()
    _tiny_run(m, tmp_path, "member", save_moments=str(tmp_path / "optimizer.safetensors"))
    moments, step = load_moments(tmp_path / "optimizer.safetensors")
    assert step == 6
    assert set(moments) == {n for n, _ in m.named_parameters()}
    assert float(moments["transformer.h.0.mlp.c_fc.weight"]["exp_avg_sq"].abs().sum()) > 0

    # zero_block on top: the member's blocks are copied, so their moments must be carried exactly
    carried = grow_moments([m], [moments], "zero_block", n_embd=16, n_layer=4, seed=0, position="top")
    for name in moments:
        for kind in MOMENT_KINDS:
            assert torch.equal(carried[name][kind], moments[name][kind]), name
    # the new blocks' zeroed output projections start with zero moments
    assert float(carried["transformer.h.3.mlp.c_proj.weight"]["exp_avg"].abs().max()) == 0.0
    assert float(carried["transformer.h.2.attn.c_proj.weight"]["exp_avg_sq"].abs().max()) == 0.0

    save_grown_moments(tmp_path / "moments.safetensors", carried, step)
    grown = grow([m], "zero_block", n_embd=16, n_layer=4, seed=0, position="top")
    opt = make_optimizer(grown, TrainConfig(tokens=1, batch_size=1, context=1, lr=1e-3, warmup_steps=0))
    assert apply_moments(grown, opt, tmp_path / "moments.safetensors") == len(carried)
    p = grown.transformer.h[1].attn.c_attn.weight
    assert torch.equal(opt.state[p]["exp_avg"], moments["transformer.h.1.attn.c_attn.weight"]["exp_avg"])
    assert float(opt.state[p]["step"]) == 6

    # the refinement really starts from them: its trajectory differs from a fresh AdamW's
    fresh = _tiny_run(grow([m], "zero_block", n_embd=16, n_layer=4, seed=0, position="top"), tmp_path, "fresh")
    carry = _tiny_run(grow([m], "zero_block", n_embd=16, n_layer=4, seed=0, position="top"), tmp_path, "carry",
                      refiners={"carry": {"moments": str(tmp_path / "moments.safetensors")}})
    assert fresh["final_val_loss"] != carry["final_val_loss"]


def test_learned_operators_refuse_carry_over():
    m = member(seed=0)
    with pytest.raises(GrowlmError, match="ligo"):
        grow_moments([m], [weights_as_moments(m)], "ligo", n_embd=32, n_layer=2, seed=0)


def test_missing_member_moments_are_named(tmp_path):
    with pytest.raises(GrowlmError, match="optimizer.safetensors"):
        load_moments(tmp_path / "m1" / "optimizer.safetensors")


def _ratio(moments: dict) -> torch.Tensor:
    """|m| / sqrt(v) of every entry with m != 0 (inf where v = 0): the size of AdamW's first step there, in
    units of the rate."""
    out = []
    for kinds in moments.values():
        m, v = kinds["exp_avg"].flatten(), kinds["exp_avg_sq"].flatten()
        out.append(m[m != 0].abs() / v[m != 0].sqrt())
    return torch.cat(out)


@pytest.mark.parametrize("method,d1,L1,opts,bounded", [
    ("lemon", 24, 3, {}, True),                                   # uneven splits: differences of weights
    (["hyperclone", "zero_block"], 32, 4, {}, True),              # its noise is scaled by each matrix's std
    (["hyperclone", "zero_block"], 32, 4, {"noise": 0.0}, False),  # plain copies
    (["net2net", "zero_block"], 32, 3, {}, False),
    ("msg", 32, 4, {}, False),
])
def test_carried_moments_never_ask_for_a_larger_step_than_the_members_did(method, d1, L1, opts, bounded, tmp_path):
    """Real AdamW moments of a trained member, grown: the second moment's linear part, clamped at zero,
    left LEMON's grown state, and HyperCloning's with its noise (scaled by each matrix's std, so not
    linear), with m != 0 where v = 0 (a first step of m / eps). The bound keeps every entry's
    |m| / sqrt(v) within the member's own largest, and it changes nothing where the operator only copies
    and splits with positive coefficients (its v is then the linear part, exactly)."""
    m = member(seed=0).float()
    _tiny_run(m, tmp_path, "member", save_moments=str(tmp_path / "optimizer.safetensors"))
    moments, _ = load_moments(tmp_path / "optimizer.safetensors")
    largest = float(_ratio(moments).max())
    carried = grow_moments([m], [moments], method, n_embd=d1, n_layer=L1, seed=5, **opts)
    assert float(_ratio(carried).max()) <= largest * 1.001 * (1 + 1e-6)

    # the linear part alone, as growlm computed it before the bound (grow(v) - grow(0), clamped at zero)
    def as_weights(kind):
        twin = member(seed=0).float()
        with torch.no_grad():
            for name, p in twin.named_parameters():
                p.copy_(moments[name][kind] if kind else torch.zeros_like(p))
        return twin

    kw = dict(n_embd=d1, n_layer=L1, seed=5, **opts)
    zero = dict(grow([as_weights(None)], method, **kw).named_parameters())
    linear = {k: (p.detach() - zero[k].detach()).clamp_min(0.0)
              for k, p in grow([as_weights("exp_avg_sq")], method, **kw).named_parameters()}
    changed = sum(int((carried[k]["exp_avg_sq"] != linear[k]).sum()) for k in linear)
    # where the bound acts, the unbounded state asked for huge first steps; elsewhere it is exact
    assert (changed > 0) if bounded else (changed == 0), changed
