"""The Llama family beside GPT-2: every exact operator is exact in both (float64, grouped-query
attention, tied and untied heads, with and without attention biases), the weight form round-trips,
the rest grow, and FLOPs and memory estimates hold for the Llama block.

Exactness is checked as in tests/test_growth.py, at a tolerance that allows the float32 rounding of
transformers' RMSNorm (it computes in float32 whatever the weights' dtype: relative errors of about
1e-7), far below what any algebra mistake gives (tests of that below).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from conftest import perturbed
from growlm.families import FAMILY, family_of
from growlm.growth import GrownModel, grow, load_grown, save_grown
from growlm.growth.members import permute
from growlm.methods import METHODS, OPERATORS
from growlm.model import build_model, load_model, save_model
from growlm.shape import ModelShape

V, T = 53, 12
TOL = 1e-5


def llama(seed: int, d: int, L: int, *, r: int = 2, tied: bool = False, bias: bool = False, hd: int = 8):
    """A float64 Llama member with grouped-query attention (r query heads per key/value head), norm
    weights and any biases perturbed, matrices scaled up (so that mistakes there show)."""
    m = build_model(seed=seed, family="llama", n_embd=d, n_layer=L, vocab_size=V, n_positions=T, head_dim=hd,
                    heads_per_kv=r, mlp_ratio=3, attention_bias=bias, tie_word_embeddings=tied)
    return perturbed(m, seed)


def tokens(seed: int = 0, batch: int = 3) -> torch.Tensor:
    return torch.randint(0, V, (batch, T), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


def err(a, b) -> float:
    return float((a - b).abs().max())


def test_the_weight_form_round_trips_in_both_families():
    x = tokens()
    for family in ("gpt2", "llama"):
        m = build_model(seed=1, family=family, n_embd=32, n_layer=2, vocab_size=V, n_positions=T, head_dim=8,
                        tie_word_embeddings=False, **({"heads_per_kv": 2, "mlp_ratio": 3} if family == "llama" else {}))
        fam = family_of(m)
        again = fam.pack(fam.unpack(m), m.config)
        assert type(again) is type(m) and ModelShape.of(again) == ModelShape.of(m)
        assert err(logits(again, x), logits(m, x)) == 0.0
        W = fam.unpack(m)
        assert (W["wpe"] is None, W["lnf_b"] is None, W["blocks"][0]["gate_w"] is None) == (
            (True, True, False) if family == "llama" else (False, False, True))


LLAMA_EXACT = [
    # (method, d0, d1, L0, L1, r, options)
    ("hyperclone", 32, 64, 2, 2, 2, {}),
    ("hyperclone", 32, 96, 1, 1, 2, {"noise": 0.5}),
    (["hyperclone", "zero_block"], 32, 64, 1, 3, 2, {}),
    ("zero_block", 32, 32, 2, 5, 2, {}),
    ("lemon", 32, 48, 2, 2, 2, {}),
    ("lemon", 32, 80, 2, 3, 2, {"noise": 0.5, "position": "top"}),
    ("lemon", 32, 48, 1, 2, 1, {"noise": 0.0}),
    ("net2net", 32, 96, 2, 2, 2, {"mapping": "cyclic", "noise": 0.3}),
    ("msg", 32, 64, 2, 2, 2, {}),
    ("msg", 32, 48, 2, 4, 2, {"position": "top"}),
    ("msg", 32, 32, 1, 3, 4, {}),
]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "attention_bias"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("method,d0,d1,L0,L1,r,opts", LLAMA_EXACT,
                         ids=[f"{m if isinstance(m, str) else '+'.join(m)}-{a}to{b}-L{c}to{d}-r{e}"
                              for m, a, b, c, d, e, _ in LLAMA_EXACT])
def test_every_exact_single_source_operator_is_exact_in_llama(method, d0, d1, L0, L1, r, opts, tied, bias):
    src = llama(1, d0, L0, r=r, tied=tied, bias=bias)
    x = tokens()
    grown = grow([src], method, n_embd=d1, n_layer=L1, seed=3, **opts)
    core = grown.inner if isinstance(grown, GrownModel) else grown
    s = ModelShape.of(core)
    assert type(core) is LlamaForCausalLM and (s.d, s.L, s.dh, s.r) == (d1, L1, 8, r)  # head size and r kept
    assert err(logits(grown, x), logits(src, x)) < TOL
    assert (core.lm_head.weight is core.model.embed_tokens.weight) == tied


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("n,chain,d1,L1,opts", [
    (2, "concat", 64, 2, {}),
    (2, "concat", 64, 2, {"cross": "random"}),
    (2, ["concat", "lemon"], 80, 2, {}),
    (2, ["concat", "zero_block"], 64, 3, {"cross": "random"}),
])
def test_concat_is_the_members_logit_average_in_llama(n, chain, d1, L1, opts, tied):
    members = [llama(10 + i, 32, 2, tied=tied) for i in range(n)]
    x = tokens(1)
    grown = grow(members, chain, n_embd=d1, n_layer=L1, seed=0, **opts)
    assert isinstance(grown, GrownModel)
    avg = torch.stack([logits(m, x) for m in members]).mean(0)
    assert err(logits(grown, x), avg) < TOL
    # the grouped RMSNorm matters: the full-width norm at once is not the average
    grown.set_ramps(ln_ramp_steps=0)
    assert err(logits(grown, x), avg) > 1e-3


def test_msg_members_is_m1_at_step_0_and_carries_every_member_in_llama():
    members = [llama(20 + i, 32, 2) for i in range(2)]
    x = tokens(2)
    grown = grow(members, "msg_members", n_embd=64, n_layer=2, seed=0)
    assert err(logits(grown, x), logits(members[0], x)) < TOL
    W = family_of(grown).unpack(grown.inner)
    kv0 = 2 * 8  # m_2's key/value heads: the second block of g0 heads
    m2 = family_of(members[1]).unpack(members[1])
    assert torch.equal(W["blocks"][0]["k_w"][32:64, kv0:2 * kv0], m2["blocks"][0]["k_w"])
    assert torch.equal(W["blocks"][0]["gate_w"][32:64, 96:192], m2["blocks"][0]["gate_w"])


def test_merge_of_a_permuted_copy_is_the_model_in_llama():
    """Weight matching permutes whole key/value groups and gated MLP units: a permuted copy is the same
    function, and merge finds it back."""
    src = llama(30, 32, 2, r=2, bias=True)
    fam = family_of(src)
    s = ModelShape.of(src)
    W = fam.unpack(src)
    g = torch.Generator().manual_seed(0)
    res = torch.randperm(s.d, generator=g)
    groups = [torch.randperm(s.g, generator=g) for _ in range(s.L)]
    units = [torch.randperm(s.f, generator=g) for _ in range(s.L)]
    twin = fam.pack(permute(W, res, groups, units, s.dh, s.r), src.config)
    x = tokens(3)
    assert err(logits(twin, x), logits(src, x)) < TOL  # the same function
    merged = grow([src, twin], "merge", n_embd=32, n_layer=2)
    assert err(logits(merged, x), logits(src, x)) < TOL


def test_broken_algebra_is_caught():
    """The tolerance discriminates: the mean-padded residue of GPT-2's LEMON, kept under RMSNorm, and a
    query head moved off its key/value group both break exactness by far more than the rounding."""
    src = llama(1, 32, 2, r=2)
    x = tokens()
    grown = grow([src], "lemon", n_embd=48, n_layer=2, seed=0, noise=0.0)
    W = family_of(grown).unpack(grown)
    with torch.no_grad():
        W["wte"][:, 32:] = W["wte"][:, :32].mean(1, keepdim=True)  # LayerNorm's residue: the row mean
    mean_padded = family_of(grown).pack(W, grown.config)
    assert err(logits(mean_padded, x), logits(src, x)) > 1e-3
    s = ModelShape.of(src)
    W = family_of(src).unpack(src)
    moved = permute(W, torch.arange(s.d), [torch.arange(s.g)] * s.L, [torch.arange(s.f)] * s.L, s.dh, s.r)
    with torch.no_grad():  # swap two query heads of different key/value groups in block 0's q only
        q = moved["blocks"][0]["q_w"].clone()
        q[:, 0:8], q[:, 16:24] = moved["blocks"][0]["q_w"][:, 16:24], moved["blocks"][0]["q_w"][:, 0:8]
        moved["blocks"][0]["q_w"] = q
    assert err(logits(family_of(src).pack(moved, src.config), x), logits(src, x)) > 1e-3


@pytest.mark.parametrize("method", [m for m in METHODS if OPERATORS[m].axis != "refine"])
def test_every_method_grows_a_llama(method):
    members = [llama(40 + i, 32, 2) for i in range(2)]
    opts = {}
    if OPERATORS[method].learned:
        opts = {"steps": 2, "batches": [tokens(5, 2), tokens(6, 2)]}
    chain = [method, "zero_block"] if OPERATORS[method].axis == "width" and method != "merge" else method
    if method == "merge":
        chain = ["merge", "msg"]
    if method == "stack_members":
        d1, L1 = 32, 4
    elif OPERATORS[method].axis == "depth":
        d1, L1 = 32, 4
    else:
        d1, L1 = 64, 4
    grown = grow(members, chain, n_embd=d1, n_layer=L1, seed=0, **opts)
    core = grown.inner if isinstance(grown, GrownModel) else grown
    assert type(core) is LlamaForCausalLM and (ModelShape.of(core).d, ModelShape.of(core).L) == (d1, L1)
    assert torch.isfinite(logits(grown, tokens())).all()


def test_a_grown_llama_ramps_saves_and_reloads(tmp_path):
    src = llama(50, 32, 2)
    grown = grow([src], "msg", n_embd=64, n_layer=3, seed=0, ramp_steps=4)
    x = tokens()
    grown.growth_step(2)
    mid = logits(grown, x)
    save_grown(grown, tmp_path / "g")
    back = load_grown(tmp_path / "g")
    back.growth_step(2)
    assert isinstance(back, GrownModel) and err(logits(back, x), mid) == 0.0
    back.growth_step(4)
    plain = back.to_plain()
    save_model(plain, tmp_path / "m")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert type(loaded) is LlamaForCausalLM
    assert err(logits(loaded.double(), x), logits(plain, x)) < 1e-12
    assert type(load_model(tmp_path / "m")) is LlamaForCausalLM


def test_members_of_different_families_are_refused():
    from growlm.errors import GrowlmError

    gpt2 = build_model(seed=1, n_embd=32, n_layer=2, vocab_size=V, n_positions=T, head_dim=8).double()
    with pytest.raises(GrowlmError, match="members differ in family"):
        grow([llama(1, 32, 2), gpt2], "concat", n_embd=64, n_layer=2)


def test_families_are_registered_with_their_traits():
    from growlm.family_specs import FAMILY_SPECS

    assert set(FAMILY) == set(FAMILY_SPECS) == {"gpt2", "llama"}
    for name, fam in FAMILY.items():
        assert fam.spec is FAMILY_SPECS[name] and fam.name == name
        assert fam.model_class.__name__ == fam.spec.architecture
    assert FAMILY_SPECS["gpt2"].traits == {"norm": "layernorm", "gated": False, "positions": "learned", "biases": True}
    assert FAMILY_SPECS["llama"].traits == {"norm": "rmsnorm", "gated": True, "positions": "rotary", "biases": False}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_config_is_read_and_written_by_its_description(family):
    """The description reads a model's config object and its config.json alike into the shape the model
    has, and writes the keys that make that shape again; its parameter count is the model's."""
    import json

    from growlm.model import n_params
    from growlm.shape import ModelShape

    extra = {"heads_per_kv": 2, "mlp_ratio": 3, "attention_bias": True} if family == "llama" else {}
    for tied in (True, False):
        m = build_model(seed=1, family=family, n_embd=32, n_layer=2, vocab_size=V, n_positions=T, head_dim=8,
                        tie_word_embeddings=tied, **extra)
        spec = FAMILY[family].spec
        s = ModelShape.of(m)
        assert ModelShape(**spec.read(json.loads(m.config.to_json_string()))) == s
        assert {k: getattr(m.config, k) for k in spec.write(s)} == spec.write(s)
        assert s.n_params == n_params(m)


def test_rotary_settings_are_carried_and_members_that_differ_in_them_are_refused():
    """Members whose rotary positions are scaled (linear, x4) grow into a model that carries the scaling:
    concat is still exactly their logit average. A member without it beside one with it is refused,
    naming the setting: growth builds from member 1's config and would drop member 2's scaling."""
    from transformers import LlamaConfig

    from growlm.errors import GrowlmError

    def scaled(m):  # the same weights, its rotary positions scaled linearly by 4
        cfg = {**m.config.to_dict(), "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}}
        out = LlamaForCausalLM(LlamaConfig.from_dict(cfg)).double().eval()
        out.load_state_dict(m.state_dict())
        return out

    plain = [llama(10 + i, 32, 2) for i in range(2)]
    members = [scaled(m) for m in plain]
    x = tokens(1)
    avg = torch.stack([logits(m, x) for m in members]).mean(0)
    assert err(avg, torch.stack([logits(m, x) for m in plain]).mean(0)) > 1e-3  # the scaling changes the function
    grown = grow(members, ["concat", "zero_block"], n_embd=64, n_layer=3, seed=0, cross="random")
    assert grown.config.rope_parameters["factor"] == 4.0
    assert err(logits(grown, x), avg) < TOL
    with pytest.raises(GrowlmError, match="members differ in their rotary settings: member 1 has .*'factor': 4.0"):
        grow([members[0], plain[1]], "concat", n_embd=64, n_layer=2)
