"""Tests of growlm.growth: exactness of the function-preserving operators (float64), symmetry
breaking, the growth-mask protocol (growth_step / ramp_done / to_plain), saving and reloading, and
the errors of bad requests."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2LMHeadModel

from conftest import perturbed
from growlm.errors import GrowlmError
from growlm.growth import GrownModel, grow, load_grown, options_of, save_grown
from growlm.growth.registry import IMPLEMENTATIONS, implements, signature_options
from growlm.methods import METHODS, OPERATORS
from growlm.model import build_model

V, T = 53, 12
TOL = 1e-5


def member(seed: int, d: int, L: int, *, head_dim: int = 8, tied: bool = True, vocab: int = V, ctx: int = T):
    """A float64 member with perturbed LN parameters and biases (so that mistakes there show)."""
    m = build_model(seed=seed, n_embd=d, n_layer=L, vocab_size=vocab, n_positions=ctx, head_dim=head_dim,
                    tie_word_embeddings=tied)
    return perturbed(m, seed, norms="ln")


def tokens(seed: int = 0, batch: int = 3, ctx: int = T) -> torch.Tensor:
    return torch.randint(0, V, (batch, ctx), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


def max_err(a, b) -> float:
    return float((a - b).detach().abs().max())


# ------------------------------------------------------------------------------------------------
# exact operators
# ------------------------------------------------------------------------------------------------

SINGLE_EXACT = [
    # (method, d0, d1, L0, L1, head_dim, options)
    ("hyperclone", 16, 32, 2, 2, 8, {}),
    ("hyperclone", 16, 48, 1, 1, 4, {"noise": 0.5}),  # odd k: last copy without noise
    ("hyperclone", 24, 96, 2, 2, 8, {"noise": 0.3}),
    (["hyperclone", "zero_block"], 16, 32, 1, 3, 8, {}),
    (["zero_block", "hyperclone"], 16, 64, 2, 5, 8, {"noise": 0.2, "position": "top"}),
    ("zero_block", 16, 16, 2, 7, 8, {}),
    ("lemon", 16, 24, 2, 2, 8, {}),
    ("lemon", 16, 40, 2, 3, 8, {"noise": 0.5, "position": "top"}),
    ("lemon", 24, 64, 1, 4, 8, {}),
    ("lemon", 16, 64, 2, 2, 16, {"noise": 0.0}),
    ("net2net", 16, 48, 2, 2, 8, {"mapping": "cyclic", "noise": 0.3}),
    ("msg", 16, 32, 2, 2, 8, {}),
    ("msg", 16, 40, 2, 5, 8, {"position": "top"}),
    ("msg", 16, 16, 1, 3, 8, {}),
]


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("method,d0,d1,L0,L1,hd,opts", SINGLE_EXACT,
                         ids=[f"{m if isinstance(m, str) else '+'.join(m)}-{a}to{b}-L{c}to{d}"
                              for m, a, b, c, d, *_ in SINGLE_EXACT])
def test_exact_single_source(method, d0, d1, L0, L1, hd, opts, tied):
    src = member(1, d0, L0, head_dim=hd, tied=tied)
    x = tokens()
    grown = grow([src], method, n_embd=d1, n_layer=L1, seed=3, **opts)
    assert grown.config.n_embd == d1 and grown.config.n_layer == L1
    assert grown.config.n_embd // grown.config.n_head == hd  # head size kept
    assert max_err(logits(grown, x), logits(src, x)) < TOL
    core = grown.inner if isinstance(grown, GrownModel) else grown
    assert (core.lm_head.weight is core.transformer.wte.weight) == tied


def test_exactness_is_discriminating():
    """The tolerance catches the classic mistakes: an un-scaled tied head and non-uniform copies."""
    src = member(1, 16, 2)
    x = tokens()
    grown = grow([src], "hyperclone", n_embd=32, n_layer=2)
    with torch.no_grad():
        grown.transformer.ln_f.weight.mul_(2.0)
        grown.transformer.ln_f.bias.mul_(2.0)
    assert max_err(logits(grown, x), logits(src, x)) > 1e-2
    uneven = grow([src], "net2net", n_embd=24, n_layer=2, mapping="random")
    assert max_err(logits(uneven, x), logits(src, x)) > 1e-3
    no_eps = grow([src], "lemon", n_embd=24, n_layer=2)
    no_eps.config.layer_norm_epsilon = 1e-5  # LEMON needs eps * s
    for mod in no_eps.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            mod.eps = 1e-5
    assert max_err(logits(no_eps, x), logits(src, x)) > 1e-9


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("n,d0,L0,chain,d1,L1,opts", [
    (2, 16, 2, "concat", 32, 2, {}),
    (3, 16, 1, "concat", 48, 1, {"cross": "random"}),
    (2, 16, 2, ["concat", "lemon"], 40, 2, {}),
    (3, 16, 2, ["concat", "lemon"], 64, 2, {"noise": 0.3}),
    (2, 16, 1, ["concat", "zero_block"], 32, 3, {"cross": "random"}),
])
def test_concat_is_logit_average(n, d0, L0, chain, d1, L1, opts, tied):
    members = [member(10 + i, d0, L0, tied=tied) for i in range(n)]
    x = tokens(1)
    grown = grow(members, chain, n_embd=d1, n_layer=L1, seed=0, **opts)
    assert isinstance(grown, GrownModel)
    assert (grown.config.n_embd, grown.config.n_layer) == (d1, L1)
    avg = torch.stack([logits(m, x) for m in members]).mean(0)
    assert max_err(logits(grown, x), avg) < TOL
    # ... and not equal to any single member nor to full-width LN (the grouping matters)
    assert max_err(logits(grown, x), logits(members[0], x)) > 1e-2
    assert max_err(logits(grown.inner, x), avg) > 1e-4


def test_concat_noise_cross_is_close_but_not_exact():
    members = [member(10 + i, 16, 1) for i in range(2)]
    x = tokens(1)
    avg = torch.stack([logits(m, x) for m in members]).mean(0)
    grown = grow(members, "concat", n_embd=32, n_layer=1, cross="noise", cross_std=1e-3)
    assert 1e-8 < max_err(logits(grown, x), avg) < 0.5


# ------------------------------------------------------------------------------------------------
# symmetry breaking
# ------------------------------------------------------------------------------------------------

def _one_adamw_step(model, seed: int = 0):
    model.train()
    x = tokens(seed, batch=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    model.eval()


def _copy_gap(model, d0: int) -> float:
    """Max difference between the two copies of the residual stream and of the MLP units."""
    x = tokens(7)
    with torch.no_grad():
        hs = model(input_ids=x, output_hidden_states=True).hidden_states
    res = max(max_err(h[..., :d0], h[..., d0:2 * d0]) for h in hs)
    fc = model.transformer.h[0].mlp.c_fc.weight.detach()
    f0 = fc.shape[1] // 2
    return max(res, max_err(fc[:, :f0].sum(0), fc[:, f0:].sum(0)))


@pytest.mark.parametrize("method", ["hyperclone", "lemon"])
def test_noise_breaks_symmetry_and_keeps_exactness(method):
    src = member(2, 16, 2)
    x = tokens()
    plain = grow([src], method, n_embd=32, n_layer=2, noise=0.0)
    noisy = grow([src], method, n_embd=32, n_layer=2, noise=0.5, seed=1)
    assert max_err(logits(noisy, x), logits(src, x)) < TOL  # still exact
    _one_adamw_step(plain)
    _one_adamw_step(noisy)
    assert _copy_gap(plain, 16) < 1e-9  # copies stay copies without noise
    assert _copy_gap(noisy, 16) > 1e-4  # and drift apart with it


def test_concat_members_are_not_copies():
    members = [member(10 + i, 16, 1) for i in range(2)]
    grown = grow(members, "concat", n_embd=32, n_layer=1)
    _one_adamw_step(grown)
    with torch.no_grad():
        assert _copy_gap(grown.inner, 16) > 1e-2


# ------------------------------------------------------------------------------------------------
# the ramp protocol, saving and reloading
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["msg", "concat"])
def test_ramp_protocol_and_reload(kind, tmp_path):
    if kind == "msg":
        members = [member(3, 16, 1)]
        grown = grow(members, "msg", n_embd=32, n_layer=2, ramp_steps=4)
        ref = logits(members[0], tokens())
    else:
        members = [member(10 + i, 16, 1) for i in range(2)]
        grown = grow(members, "concat", n_embd=32, n_layer=1, cross="random", ramp_steps=4, ln_ramp_steps=3)
        ref = torch.stack([logits(m, tokens()) for m in members]).mean(0)
    x = tokens()
    assert isinstance(grown, GrownModel) and not grown.ramp_done
    with pytest.raises(GrowlmError, match="ramp"):
        grown.to_plain()
    # save / load at step 0: same function
    save_grown(grown, tmp_path / "g0")
    assert (tmp_path / "g0" / "config.json").exists()  # its inner model, a transformers folder; the masks beside it
    again = load_grown(tmp_path / "g0")
    assert isinstance(again, GrownModel)
    assert max_err(logits(again, x), ref) < TOL
    # training through the ramp: finite losses, the function changes along the ramp
    opt = torch.optim.AdamW(grown.parameters(), lr=1e-3)
    grown.train()
    for step in range(5):
        grown.growth_step(step)
        loss = grown(input_ids=x, labels=x).loss
        assert torch.isfinite(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 2:  # mid-ramp save/load keeps the step and the function
            save_grown(grown, tmp_path / "g2")
            mid = load_grown(tmp_path / "g2")
            assert mid.step == 2 and max_err(logits(mid, x), logits(grown, x)) < 1e-10
    grown.growth_step(5)
    assert grown.ramp_done
    grown.eval()
    # at the end of the ramp the masked computation is exactly the inner model
    with torch.no_grad():
        assert max_err(grown.masked_forward(x).logits, logits(grown.inner, x)) < 1e-10
    plain = grown.to_plain()
    assert type(plain) is GPT2LMHeadModel
    plain.save_pretrained(tmp_path / "plain")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "plain", dtype=torch.float64)
    assert max_err(logits(reloaded, x), logits(grown, x)) < 1e-10


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_save_reload_plain(tmp_path, tied):
    src = member(4, 16, 2, tied=tied)
    grown = grow([src], ["hyperclone", "zero_block"], n_embd=32, n_layer=3, noise=0.1)
    assert type(grown) is GPT2LMHeadModel
    save_grown(grown, tmp_path)
    x = tokens()
    for again in (load_grown(tmp_path), AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)):
        assert max_err(logits(again.double(), x), logits(src, x)) < TOL
        assert (again.lm_head.weight is again.transformer.wte.weight) == tied


# ------------------------------------------------------------------------------------------------
# every method through grow()
# ------------------------------------------------------------------------------------------------

def _route(name: str):
    """A chain through `name` from 2 members (16 wide, 1 deep) to 32 wide, 2 deep."""
    info = OPERATORS[name]
    if info.axis == "refine":  # teach, freeze, carry grow nothing: they ride on a growth operator
        return ["msg", name], {}
    if name == "merge":
        return ["merge", "msg"], {}
    if name == "stack_members":
        return ["hyperclone", "stack_members"], {}
    if name == "concat":
        return ["concat", "zero_block"], {}
    if name in ("ligo", "mango"):
        return name, {"steps": 2, "batches": [tokens(i, batch=2) for i in range(2)]}
    if info.kind == "depth":
        return ["hyperclone", name], {}
    if info.kind == "width":
        return [name, "zero_block"], {}
    return name, {}


@pytest.mark.parametrize("name", METHODS)
def test_every_method_grows(name):
    members = [member(20 + i, 16, 1) for i in range(2)]
    chain, opts = _route(name)
    grown = grow(members, chain, n_embd=32, n_layer=2, seed=0, **opts)
    assert (grown.config.n_embd, grown.config.n_layer) == (32, 2)
    x = tokens(3)
    out = grown(input_ids=x, labels=x)
    assert out.logits.shape == (3, T, V)
    assert torch.isfinite(out.loss)
    assert isinstance(getattr(grown, "growlm_growth_flops", None), int)
    if OPERATORS[name].exact and name not in ("concat",):
        assert max_err(out.logits, logits(members[0], x)) < TOL


def test_methods_and_options_listed():
    assert METHODS == sorted(METHODS)
    for name in ("hyperclone", "zero_block", "lemon", "concat", "msg", "stack", "interleave"):
        assert name in METHODS
    assert options_of("hyperclone") == {"noise": 0.316}  # the paper's 10 dB (growlm.recipes)
    assert options_of("zero_block") == {"position": "interleave"}


def test_every_described_operator_is_implemented_with_its_options():
    """growlm.methods (what the Snakefile reads without torch) describes exactly the implemented
    operators, and each implementation takes exactly the options (and defaults) its description
    lists; a mismatch is refused when the implementation registers."""
    from growlm.methods import members_used

    assert sorted(IMPLEMENTATIONS) == [m for m in METHODS if OPERATORS[m].axis != "refine"]
    for name, fn in IMPLEMENTATIONS.items():
        assert signature_options(fn) == OPERATORS[name].options, name
    assert members_used(["concat", "zero_block"], 3) == 3
    assert members_used("msg", 3) == 1

    def wrong_default(models, *, n_embd, n_layer, n_head=None, seed=0, noise=0.5):
        return models[0]

    with pytest.raises(GrowlmError, match="differ from its description"):
        implements("hyperclone")(wrong_default)
    with pytest.raises(GrowlmError, match="does not describe"):
        implements("no_such_operator")(wrong_default)


# ------------------------------------------------------------------------------------------------
# bad requests
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("members,method,kw,match", [
    (lambda: [member(1, 16, 1)], "no_such_op", {}, r"unknown growth method 'no_such_op'; known: .*hyperclone"),
    (lambda: [member(1, 32, 1)], "hyperclone", {"n_embd": 16}, "smaller than the members' width 32"),
    (lambda: [member(1, 16, 2)], "zero_block", {"n_embd": 16, "n_layer": 1}, "smaller than the members' depth 2"),
    (lambda: [member(1, 16, 1)], "hyperclone", {"n_embd": 40}, "multiple of the source width 16.*lemon"),
    (lambda: [member(1, 16, 1)], "hyperclone", {"n_layer": 3}, r"depth 1 instead of 3.*'hyperclone', 'zero_block'"),
    (lambda: [member(1, 16, 1)], "zero_block", {"n_layer": 3}, r"width 16 instead of 32"),
    (lambda: [member(1, 16, 1), member(2, 16, 1, vocab=V + 1)], "concat", {}, "vocabulary size"),
    (lambda: [member(1, 16, 1), member(2, 24, 1)], "concat", {}, "width"),
    (lambda: [member(1, 16, 1), member(2, 16, 1, ctx=T + 4)], "concat", {}, "context"),
    (lambda: [member(1, 16, 1), member(2, 16, 2)], "concat", {}, "depth"),
    (lambda: [member(1, 16, 1), member(2, 16, 1, tied=False)], "concat", {}, "tie_word_embeddings"),
    (lambda: [member(1, 16, 1), member(2, 16, 1)], "concat", {"n_embd": 40}, r"\['concat', 'lemon'\]"),
    (lambda: [member(1, 16, 1)], "hyperclone", {"n_head": 2}, "head size"),
    (lambda: [member(1, 16, 1)], "lemon", {"n_embd": 36}, "multiple of the head size"),
    (lambda: [member(1, 16, 1)], "hyperclone", {"bogus": 1}, "bogus"),
    (lambda: [member(1, 16, 1)], "zero_block", {"n_embd": 16, "n_layer": 2, "position": "middle"}, "position"),
    (lambda: [member(1, 16, 1), member(2, 16, 1)], ["hyperclone", "stack_members"], {"n_layer": 3},
     "stack_members"),
    (lambda: [], "hyperclone", {}, "at least one member"),
])
def test_bad_requests(members, method, kw, match):
    kw = {"n_embd": 32, "n_layer": 1, **kw}
    with pytest.raises(GrowlmError, match=match):
        grow(members(), method, **kw)


# ------------------------------------------------------------------------------------------------
# multi-level operators
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_multilevel_round_trip(tied):
    from growlm.schedules.vcycle import coalesce, decoalesce, interpolate

    small = member(5, 16, 2, tied=tied)
    x = tokens()
    up = decoalesce(small, n_embd=32, n_layer=4)
    assert (up.config.n_embd, up.config.n_layer, up.config.n_head) == (32, 4, 4)
    wide = decoalesce(small, n_embd=32, n_layer=2)
    assert max_err(logits(wide, x), logits(small, x)) < TOL  # width de-coalescing is exact
    down = coalesce(up, n_embd=16, n_layer=2)
    assert max_err(logits(down, x), logits(small, x)) < 1e-10  # coalesce is a left inverse
    for a, b in zip(down.parameters(), small.parameters()):
        assert max_err(a, b) < 1e-12
    large = member(6, 32, 4, tied=tied)
    mix = interpolate(large, small, alpha=0.5)
    p_mix = mix.transformer.h[1].mlp.c_fc.weight
    expected = 0.5 * large.transformer.h[1].mlp.c_fc.weight + 0.5 * up.transformer.h[1].mlp.c_fc.weight
    assert max_err(p_mix, expected) < 1e-12
    assert max_err(interpolate(large, small, alpha=0.0).transformer.wte.weight, large.transformer.wte.weight) < 1e-12
    with pytest.raises(GrowlmError, match="multiple"):
        coalesce(large, n_embd=24, n_layer=2)


# ------------------------------------------------------------------------------------------------
# learned operators (LiGO, Mango)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,rank", [("ligo", 1), ("mango", 3)])
def test_learned_init_is_a_copy(name, rank):
    """With one member, an integer width factor, equal depth and no init noise the operator starts
    as an exact clone (so the learned maps are initialised sensibly)."""
    src = member(1, 16, 2, tied=rank == 1)
    x = tokens()
    kw = {"rank": rank} if name == "mango" else {}
    grown = grow([src], name, n_embd=32, n_layer=2, steps=0, init_noise=0.0, **kw)
    assert type(grown) is GPT2LMHeadModel and grown.growlm_growth_flops == 0
    assert max_err(logits(grown, x), logits(src, x)) < TOL


@pytest.mark.parametrize("name", ["ligo", "mango"])
def test_learned_training_lowers_the_loss(name):
    from growlm.flops import train_flops_per_token

    members = [member(30 + i, 16, 1) for i in range(2)]
    batches = [tokens(i, batch=4) for i in range(2)]
    kw = dict(n_embd=32, n_layer=2, seed=1, batches=batches, lr=3e-2)
    before = grow(members, name, steps=0, **kw)
    after = grow(members, name, steps=12, **kw)

    def loss(m):
        with torch.no_grad():
            return float(sum(m(input_ids=b, labels=b).loss for b in batches))

    assert loss(after) < loss(before) - 0.05
    model_flops = 12 * 4 * T * train_flops_per_token(n_embd=32, n_layer=2, vocab_size=V, context=T)
    assert after.growlm_growth_flops > model_flops  # plus the cost of materialising the weights
    assert after.growlm_growth_flops < 20 * model_flops


def test_learned_needs_batches():
    with pytest.raises(GrowlmError, match="batches"):
        grow([member(1, 16, 1)], "ligo", n_embd=32, n_layer=2, steps=3)
