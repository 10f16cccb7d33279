"""A third family, added in this test alone: a family is one description and one class.

A GPT-NeoX family (transformers' `GPTNeoXForCausalLM`: LayerNorm with bias, rotary positions on a
quarter of each head, a plain GELU MLP, biases on every projection, one fused query/key/value
projection whose channels are interleaved per head) is described here by a `FamilySpec` and a
`Family` subclass and registered for the test's duration. Nothing else of growlm is told about it:
the exact growth operators are exact on it (float64, logits to 1e-5), the other operators grow it,
its parameter count is the model's, the memory estimate holds against the measured CPU peak (as
tests/test_plan.py checks GPT-2 and Llama), the FLOPs formula counts its matrices, and what growlm
cannot grow of it - a parallel residual (Pythia's default), which neither the family class's masked
forward nor the description computes - is refused with a GrowlmError when its config is read.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

from conftest import perturbed
from growlm.errors import GrowlmError
from growlm.families import FAMILY, Family
from growlm.family_specs import FAMILY_SPECS, FamilySpec
from growlm.flops import shape_flops, train_flops_per_token
from growlm.growth import GrownModel, grow, load_grown, save_grown
from growlm.memory import estimate as P
from growlm.memory.measure import measure_line
from growlm.methods import METHODS, OPERATORS
from growlm.model import build_model, n_params
from growlm.pretrained import shape_of_config, weight_problems
from growlm.shape import ModelShape

V, T = 53, 12
TOL = 1e-5


# ------------------------------------------------------------------------------------------------
# the family: its description and its class
# ------------------------------------------------------------------------------------------------

def neox_activations(s, s_a: int, s_r: int) -> tuple[int, int, int]:
    """GPTNeoXLayer (sequential residual, SDPA), per token, as autograd's saved-tensor hooks list them:
    the block input and the residual before the second norm (s_r d each); the first norm's output, the
    fused q/k/v output (3 d: v, a view of it, keeps it whole), the rotated q and k (new tensors), SDPA's
    output and the contiguous copy the output projection keeps, the second norm's output (9 s_a d); the
    MLP's input projection and GELU outputs (2 s_a f); SDPA's logsumexp (4 h) and two LayerNorms'
    statistics (16). The backward's transient and the final norm are GPT-2's."""
    d, f, h = s.d, s.f, s.h
    a_block = (2 * s_r + 9 * s_a) * d + 2 * s_a * f + 4 * h + 16
    return a_block, 2 * s_a * f + s_r * d, s_r * d + 8


NEOX = FamilySpec(
    name="neox", model_type="gpt_neox", architecture="GPTNeoXForCausalLM",
    norm="layernorm", gated=False, positions="rotary", biases=True, grouped_query=False,
    keys={"vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_hidden_layers",
          "n_head": "num_attention_heads", "n_inner": "intermediate_size", "n_positions": "max_position_embeddings",
          "tie_word_embeddings": "tie_word_embeddings", "activation": "hidden_act", "eps": "layer_norm_eps"},
    defaults={"n_positions": 2048, "tie_word_embeddings": False},
    fixed={"use_parallel_residual": False, "attention_bias": True},
    activations=neox_activations,
    weights=lambda s: [("embed_in.weight", (s.V, s.d), "vocab_size x hidden_size"),
                       ("layers.0.attention.query_key_value.weight", (3 * s.d, s.d), "3 hidden_size x hidden_size"),
                       ("layers.0.mlp.dense_h_to_4h.weight", (s.f, s.d), "intermediate_size x hidden_size")],
    lacks="one key/value head per query head, a 4 d MLP and biases",
)


class NeoXFamily(Family):
    spec = NEOX
    model_class = GPTNeoXForCausalLM
    config_class = GPTNeoXConfig

    def config(self, shape, *, like=None):
        if like is not None:
            base = {k: v for k, v in like.to_dict().items()
                    if k not in ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype")}
        else:
            base = dict(hidden_act="gelu", hidden_dropout=0.0, attention_dropout=0.0, initializer_range=0.02,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                        bos_token_id=0, eos_token_id=0, use_cache=False)
        base.update(self.spec.write(shape))
        config = GPTNeoXConfig(**base)
        config._attn_implementation = "sdpa"
        return config

    @staticmethod
    def _qkv(w, H: int):
        """The fused projection's (out, in) weight (or bias) as q, k, v in (out, in): output channel
        h 3 dh + j dh + e is channel e of head h of part j (q, k, v)."""
        w = w.reshape(H, 3, -1, *w.shape[1:])
        return [w[:, j].reshape(-1, *w.shape[3:]) for j in range(3)]

    def unpack(self, model) -> dict:
        m, H = model.gpt_neox, model.config.num_attention_heads
        blocks = []
        for blk in m.layers:
            a, p = blk.attention, blk.mlp
            (qw, kw, vw), (qb, kb, vb) = self._qkv(a.query_key_value.weight.detach(), H), \
                self._qkv(a.query_key_value.bias.detach(), H)
            blocks.append({
                "ln1_w": blk.input_layernorm.weight.detach(), "ln1_b": blk.input_layernorm.bias.detach(),
                "q_w": qw.T, "q_b": qb, "k_w": kw.T, "k_b": kb, "v_w": vw.T, "v_b": vb,
                "o_w": a.dense.weight.detach().T, "o_b": a.dense.bias.detach(),
                "ln2_w": blk.post_attention_layernorm.weight.detach(),
                "ln2_b": blk.post_attention_layernorm.bias.detach(),
                "fc_w": p.dense_h_to_4h.weight.detach().T, "fc_b": p.dense_h_to_4h.bias.detach(),
                "gate_w": None, "gate_b": None,
                "pr_w": p.dense_4h_to_h.weight.detach().T, "pr_b": p.dense_4h_to_h.bias.detach(),
            })
        tied = model.lm_head.weight is m.embed_in.weight or bool(model.config.tie_word_embeddings)
        return {"wte": m.embed_in.weight.detach(), "wpe": None, "lnf_w": m.final_layer_norm.weight.detach(),
                "lnf_b": m.final_layer_norm.bias.detach(), "head": None if tied else model.lm_head.weight.detach(),
                "blocks": blocks}

    def state_dict(self, W: dict, config=None) -> dict:
        H = config.num_attention_heads  # the fused projection is interleaved per head
        sd = {"gpt_neox.embed_in.weight": W["wte"], "gpt_neox.final_layer_norm.weight": W["lnf_w"],
              "gpt_neox.final_layer_norm.bias": W["lnf_b"]}
        for i, b in enumerate(W["blocks"]):
            p, d = f"gpt_neox.layers.{i}.", b["q_w"].shape[0]
            sd[p + "attention.query_key_value.weight"] = torch.stack(
                [b[k + "_w"].T.reshape(H, -1, d) for k in "qkv"], 1).reshape(-1, d)
            sd[p + "attention.query_key_value.bias"] = torch.stack([b[k + "_b"].reshape(H, -1) for k in "qkv"],
                                                                   1).reshape(-1)
            sd[p + "attention.dense.weight"], sd[p + "attention.dense.bias"] = b["o_w"].T, b["o_b"]
            sd[p + "input_layernorm.weight"], sd[p + "input_layernorm.bias"] = b["ln1_w"], b["ln1_b"]
            sd[p + "post_attention_layernorm.weight"], sd[p + "post_attention_layernorm.bias"] = b["ln2_w"], b["ln2_b"]
            sd[p + "mlp.dense_h_to_4h.weight"], sd[p + "mlp.dense_h_to_4h.bias"] = b["fc_w"].T, b["fc_b"]
            sd[p + "mlp.dense_4h_to_h.weight"], sd[p + "mlp.dense_4h_to_h.bias"] = b["pr_w"].T, b["pr_b"]
        if W["head"] is not None:
            sd["lm_head.weight"] = W["head"]
        return sd

    # -- forward pieces (GPTNeoXLayer's operations, sequential residual) -------------------------
    def blocks(self, model) -> list:
        return list(model.gpt_neox.layers)

    def set_blocks(self, model, blocks) -> None:
        model.gpt_neox.layers = blocks

    def norms(self, block) -> tuple:
        return block.input_layernorm, block.post_attention_layernorm

    def final_norm(self, model):
        return model.gpt_neox.final_layer_norm

    def embed(self, model, input_ids):
        return model.gpt_neox.embed_in(input_ids)

    def attention(self, model, l, h, *, cross, m_head):
        a = model.gpt_neox.layers[l].attention
        H = model.config.num_attention_heads
        dh = a.head_size
        B, Tn = h.shape[:2]
        ws, bs = self._qkv(a.query_key_value.weight, H), self._qkv(a.query_key_value.bias, H)
        q, k, v = (F.linear(h, w if cross is None else w * cross[key].T.to(w.dtype), bias)
                   .reshape(B, Tn, H, dh).transpose(1, 2) for w, bias, key in zip(ws, bs, "qkv"))
        cos, sin = model.gpt_neox.rotary_emb(h, torch.arange(Tn, device=h.device)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=a.scaling)
        if m_head is not None:
            out = out * m_head.to(out.dtype)[None, :, None, None]
        out = out.transpose(1, 2).reshape(B, Tn, H * dh)
        w = a.dense.weight
        return F.linear(out, w if cross is None else w * cross["o"].T.to(w.dtype), a.dense.bias)

    def mlp(self, model, l, h, *, cross, m_mlp):
        p = model.gpt_neox.layers[l].mlp
        w = p.dense_h_to_4h.weight
        u = p.act(F.linear(h, w if cross is None else w * cross["fc"].T.to(w.dtype), p.dense_h_to_4h.bias))
        if m_mlp is not None:
            u = u * m_mlp.to(u.dtype)
        w = p.dense_4h_to_h.weight
        return F.linear(u, w if cross is None else w * cross["pr"].T.to(w.dtype), p.dense_4h_to_h.bias)


@pytest.fixture(autouse=True)
def neox(monkeypatch):
    """The family registered for one test: its description and its class, nothing else."""
    monkeypatch.setitem(FAMILY_SPECS, NEOX.name, NEOX)
    monkeypatch.setitem(FAMILY, NEOX.name, NeoXFamily())
    return NEOX


def member(seed: int, d: int, L: int, *, tied: bool = False, hd: int = 8):
    """A float64 NeoX member with its norms and biases perturbed and its matrices scaled up, so that
    mistakes there show."""
    m = build_model(seed=seed, family="neox", n_embd=d, n_layer=L, vocab_size=V, n_positions=T, head_dim=hd,
                    tie_word_embeddings=tied)
    return perturbed(m, seed)


def tokens(seed: int = 0, batch: int = 3) -> torch.Tensor:
    return torch.randint(0, V, (batch, T), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


def err(a, b) -> float:
    return float((a - b).abs().max())


# ------------------------------------------------------------------------------------------------
# the tests
# ------------------------------------------------------------------------------------------------

def test_the_description_reads_writes_and_counts_a_neox_model():
    for tied in (False, True):
        m = member(1, 32, 2, tied=tied)
        assert type(m) is GPTNeoXForCausalLM and not m.config.use_parallel_residual
        s = ModelShape.of(m)
        assert (s.family, s.d, s.L, s.h, s.f, s.tied, s.norm, s.gated, s.learned_positions) == (
            "neox", 32, 2, 4, 128, tied, "layernorm", False, False)
        assert s.n_params == n_params(m)  # biases everywhere, LayerNorm biases, no position table
        cfg = json.loads(m.config.to_json_string())
        assert shape_of_config(cfg, "member 1") == s
        fam = FAMILY["neox"]
        again = fam.pack(fam.unpack(m), m.config)
        assert err(logits(again, tokens()), logits(m, tokens())) == 0.0
    # a member's weights against its config (the safetensors header check): the description names the
    # tensors its config fixes, so weights of another width or depth are named
    header = {name: {"shape": list(t.shape)} for name, t in m.state_dict().items()}
    assert weight_problems(header, s) == []
    wrong = weight_problems(header, ModelShape(**{**s.as_dict(), "n_embd": 64, "n_head": 8, "n_layer": 3}))
    assert any("query_key_value" in w for w in wrong) and any("3" in w and "blocks" in w for w in wrong), wrong
    # FLOPs: the formula's matrices are the model's matrices (no gate, one key/value head per head)
    matrices = sum(p.numel() for name, p in m.named_parameters() if p.dim() == 2 and "embed_in" not in name)
    expected = 6 * (matrices + (V * 32 if tied else 0)) + 12 * 2 * T * 32
    assert train_flops_per_token(context=T, **shape_flops(s)) == expected


def test_what_growlm_cannot_grow_of_it_is_refused():
    """Pythia's parallel residual (attention and MLP both read the block's input) is not the sequential
    block the family computes: reading such a config is a GrowlmError naming the key."""
    m = member(1, 32, 1)
    cfg = json.loads(m.config.to_json_string())
    parallel = GPTNeoXConfig(**{**{k: v for k, v in cfg.items() if k not in ("architectures",
                                                                                 "transformers_version")},
                                "use_parallel_residual": True})
    with pytest.raises(GrowlmError, match="use_parallel_residual"):
        ModelShape.of(parallel)
    with pytest.raises(GrowlmError, match="use_parallel_residual"):
        shape_of_config({**cfg, "use_parallel_residual": True}, "member 1")
    with pytest.raises(GrowlmError, match="use_parallel_residual"):
        grow([GPTNeoXForCausalLM(parallel)], "hyperclone", n_embd=64, n_layer=1)


NEOX_EXACT = [
    # (method, d0, d1, L0, L1, options)
    ("hyperclone", 32, 64, 2, 2, {}),
    ("hyperclone", 32, 96, 1, 1, {"noise": 0.5}),
    (["hyperclone", "zero_block"], 32, 64, 1, 3, {}),
    ("zero_block", 32, 32, 2, 4, {}),
    ("lemon", 32, 48, 2, 2, {}),
    ("lemon", 32, 80, 2, 3, {"noise": 0.5, "position": "top"}),
    ("net2net", 32, 96, 2, 2, {"mapping": "cyclic", "noise": 0.3}),
    ("msg", 32, 64, 2, 2, {}),
    ("msg", 32, 48, 2, 4, {"position": "top"}),
]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("method,d0,d1,L0,L1,opts", NEOX_EXACT,
                         ids=[f"{m if isinstance(m, str) else '+'.join(m)}-{a}to{b}-L{c}to{d}"
                              for m, a, b, c, d, _ in NEOX_EXACT])
def test_every_exact_single_source_operator_is_exact_in_neox(method, d0, d1, L0, L1, opts, tied):
    src = member(1, d0, L0, tied=tied)
    x = tokens()
    grown = grow([src], method, n_embd=d1, n_layer=L1, seed=3, **opts)
    core = grown.inner if isinstance(grown, GrownModel) else grown
    s = ModelShape.of(core)
    assert type(core) is GPTNeoXForCausalLM and (s.d, s.L, s.dh) == (d1, L1, 8)  # the head size kept
    assert err(logits(grown, x), logits(src, x)) < TOL
    assert (core.lm_head.weight is core.gpt_neox.embed_in.weight) == tied


def test_exactness_is_discriminating_in_neox():
    """The tolerance catches a mistake in the family's own code: q and k read from the wrong channels of
    the fused projection (an interleaving that ignores the heads) change the logits."""
    src = member(1, 32, 2)
    x = tokens()
    grown = grow([src], "hyperclone", n_embd=64, n_layer=2)
    assert err(logits(grown, x), logits(src, x)) < TOL
    with torch.no_grad():
        w = grown.gpt_neox.layers[0].attention.query_key_value.weight
        w.copy_(w.reshape(3, -1, w.shape[1]).transpose(0, 1).reshape(w.shape))
    assert err(logits(grown, x), logits(src, x)) > 1e-3


def test_concat_is_the_members_logit_average_in_neox():
    members = [member(10 + i, 32, 2) for i in range(2)]
    x = tokens(1)
    grown = grow(members, "concat", n_embd=64, n_layer=2, seed=0)
    assert isinstance(grown, GrownModel)
    avg = torch.stack([logits(m, x) for m in members]).mean(0)
    assert err(logits(grown, x), avg) < TOL


@pytest.mark.parametrize("method", [m for m in METHODS if OPERATORS[m].axis != "refine"])
def test_every_method_grows_a_neox(method, tmp_path):
    """Every growth method, routed as tests/test_families.py routes them for Llama, grows a NeoX."""
    members = [member(20 + i, 32, 2) for i in range(2)]
    opts = {"steps": 2, "batches": [tokens(5, 2), tokens(6, 2)]} if OPERATORS[method].learned else {}
    chain = [method, "zero_block"] if OPERATORS[method].axis == "width" and method != "merge" else method
    if method == "merge":
        chain = ["merge", "msg"]
    d1, L1 = (32, 4) if OPERATORS[method].axis == "depth" or method == "stack_members" else (64, 4)
    grown = grow(members, chain, n_embd=d1, n_layer=L1, seed=0, **opts)
    core = grown.inner if isinstance(grown, GrownModel) else grown
    assert type(core) is GPTNeoXForCausalLM and (ModelShape.of(core).d, ModelShape.of(core).L) == (d1, L1)
    assert torch.isfinite(logits(grown, tokens())).all()
    if isinstance(grown, GrownModel):  # saved, reloaded and ramped into a plain NeoX
        save_grown(grown, tmp_path / "g")
        back = load_grown(tmp_path / "g")
        assert err(logits(back, tokens()), logits(grown, tokens())) == 0.0


@pytest.mark.parametrize("n_layer,micro,every", [(2, 4, 0), (4, 8, 0), (4, 4, 2)])
def test_memory_estimate_matches_measured_cpu_peak_in_neox(n_layer, micro, every):
    """The estimate with the description's activation term against the CPU allocator's measured peak, at
    test_plan.py's tolerances (3% without recomputation; up to 15% high with it)."""
    shape = ModelShape(n_embd=64, n_layer=n_layer, vocab_size=512, n_head=4, n_positions=64, family="neox")
    line = measure_line(shape, context=64, micro_batches=(micro,), recompute_every=every)
    est = P.estimate_memory(shape, micro_batch=micro, context=64, recompute_every=every)["total"]
    ratio = est / line["peak_bytes"][0]
    assert 0.97 <= ratio <= (1.15 if every else 1.03), ratio


def test_a_config_chooses_it_by_name():
    """The config check takes the family by its registered name (the schema names no family): the tiny
    experiment as NeoX passes every check, and its jobs' model settings say neox; without the
    registration the same config stops at the check, naming the families growlm has."""
    import copy

    import yaml
    from snakemake.utils import update_config, validate

    from conftest import REPO, TINY
    from growlm.experiment import model_settings
    from growlm.validate import check_config

    schema = REPO / "workflow" / "schemas" / "config.schema.yaml"
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    update_config(config, yaml.safe_load(TINY.read_text()))
    update_config(config, {"model": {"family": "neox"}, "methods": ["lemon", "msg", ["concat", "zero_block"]]})

    def resolve(source):
        return REPO / "workflow" / "resources" / "corpus" / source["bundled"]

    def check(cfg):
        return check_config(cfg, schema, resolve_source=resolve, fill_defaults=lambda c: validate(c, str(schema)))

    chosen = copy.deepcopy(config)
    sweep = check(chosen)
    assert model_settings(chosen, n_embd=sweep["d1"][0], n_layer=sweep["L1"][0])["family"] == "neox"
    del FAMILY_SPECS["neox"]  # restored by the fixture's monkeypatch
    with pytest.raises(GrowlmError, match="model.family = 'neox': not a model family growlm has; one of gpt2, llama"):
        check(copy.deepcopy(config))
