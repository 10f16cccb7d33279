"""Model families: how each builds its models, and its weights in the one form the growth algebra uses.

growlm grows two families of decoder, each described once torch-free (`growlm.family_specs`: config
keys, traits, settings, parameter and activation counts) and built by one class here (`FAMILY`):

* `gpt2` (`GPT2LMHeadModel`): LayerNorm with bias, learned positions, a GELU MLP, biases everywhere,
  one fused `c_attn` for q, k, v; matrices in `Conv1D` orientation (in, out).
* `llama` (`LlamaForCausalLM`): RMSNorm without bias (computed in float32), rotary positions, a
  gated SiLU MLP (`down(silu(gate(x)) * up(x))`), grouped-query attention (g key/value heads shared
  by r = h / g query heads each: query head i reads key/value head i // r), no biases unless
  `attention_bias` (q, k, v and o: the Qwen2-style variant); `nn.Linear` weights (out, in); a tied or
  untied head.

The weight form
---------------
A `Family` unpacks a model into a dict of tensors that the operators work on, and packs such a dict
back into a model. The operators never see a family's parameter names::

    {"wte": (V, d)              token embedding (a writer of the residual stream)
     "wpe": (T, d) | None       learned positions (gpt2); None for rotary positions
     "lnf_w": (d,), "lnf_b": (d,) | None      the final norm (no bias: RMSNorm)
     "head": (V, d) | None      an untied head (a reader of the final norm); None = tied to wte
     "blocks": [{
        "ln1_w", "ln1_b"        the norm before attention ("_b" None for RMSNorm)
        "q_w": (d, h dh)  "q_b"   query projection, (in, out); output channel i dh + e: channel e of head i
        "k_w": (d, g dh)  "k_b"   key and value projections over the g key/value heads
        "v_w": (d, g dh)  "v_b"
        "o_w": (h dh, d)  "o_b"   attention output projection (a writer)
        "ln2_w", "ln2_b"        the norm before the MLP
        "fc_w": (d, f)    "fc_b"  the MLP's input projection (llama: up_proj)
        "gate_w": (d, f) | None, "gate_b"   llama's gate projection; None for a plain MLP
        "pr_w": (f, d)    "pr_b"  the MLP's output projection (a writer; llama: down_proj)
     }, ...]}

Every matrix is in (in, out) orientation (y = x @ W + b) whatever the family stores; a bias a model
does not have is None. A hidden MLP unit u is (column u of fc_w and gate_w, row u of pr_w); a head is
its dh channels; a key/value head serves r consecutive query heads. `shape_of` gives the model's
`ModelShape`, whose `family` and traits (norm kind, gated, positions) tell the operators the rest.

The masked forward of a grown model (`growlm.growth.masked`) asks the family for the pieces of a
block (`attention`, `mlp`, `embed`, `logits`), computed from the live modules, so that masks and
grouped norms are written once for both families.

Adding a family (e.g. GPT-NeoX/Pythia) means its `FamilySpec` (growlm.family_specs.register), one
subclass of `Family` with these methods and `spec` set to it (in `FAMILY` under the same name), and the
exactness tests for it (tests/test_third_family.py registers one inside the test alone).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PretrainedConfig
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from growlm.console import log
from growlm.errors import GrowlmError
from growlm.family_specs import GPT2, LLAMA, FamilySpec, grown_model_types
from growlm.loading import load_into, materialise_buffers
from growlm.shape import ModelShape

BLOCK_KEYS = ("ln1_w", "ln1_b", "q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w", "o_b",
              "ln2_w", "ln2_b", "fc_w", "fc_b", "gate_w", "gate_b", "pr_w", "pr_b")
WRITER_KEYS = ("o_w", "o_b", "pr_w", "pr_b")  # what a block adds to the residual stream


def _detach(t):
    return None if t is None else t.detach()


class Family:
    """How one family's models are built, unpacked into the weight form and packed back. What needs no
    torch (config keys, traits, counts) is its `spec`; the class adds the model class and its names."""

    spec: FamilySpec
    model_class: type
    config_class: type

    @property
    def name(self) -> str:
        return self.spec.name

    # -- configs ----------------------------------------------------------------------------------
    def config(self, shape: ModelShape, *, like: PretrainedConfig | None = None) -> PretrainedConfig:
        """The config of a model of `shape`: growlm's defaults, or those of `like` (a member's
        config: its activation, norm epsilon, rotary base...) with the sizes of `shape`."""
        raise NotImplementedError

    def resized(self, config: PretrainedConfig, *, n_embd: int, n_layer: int, n_head: int,
                n_inner: int | None | str = "same", eps: float | None = None) -> PretrainedConfig:
        """`config` with a new width, depth and head count (key/value heads follow the query heads:
        their ratio is kept), optionally a new MLP width and norm epsilon."""
        s = ModelShape.of(config)
        inner = s.f * n_embd // s.d if n_inner == "same" else n_inner
        if n_inner == "same" and s.n_inner is None:
            inner = None
        kv = None if s.n_kv_head is None else max(1, n_head // s.r)
        new = ModelShape(n_embd=n_embd, n_layer=n_layer, n_head=n_head, vocab_size=s.V, n_positions=s.T,
                         n_inner=inner, tie_word_embeddings=s.tied, family=s.family, n_kv_head=kv,
                         attention_bias=s.attention_bias)
        out = self.config(new, like=config)
        if eps is not None:
            self.set_eps(out, eps)
        return out

    def eps(self, config) -> float:
        return float(getattr(config, self.spec.keys["eps"]))

    def set_eps(self, config, eps: float) -> None:
        setattr(config, self.spec.keys["eps"], float(eps))

    def activation(self, config) -> str:
        """The MLP's activation function as the config names it."""
        return getattr(config, self.spec.keys["activation"])

    def init_std(self, config) -> float:
        return float(config.initializer_range)

    # -- models -----------------------------------------------------------------------------------
    def build(self, config: PretrainedConfig, seed: int) -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.model_class(config)

    def empty(self, config: PretrainedConfig) -> torch.nn.Module:
        """A model on the meta device (no random initialisation cost)."""
        with torch.device("meta"):
            return self.model_class(config)

    def unpack(self, model) -> dict:
        raise NotImplementedError

    def adopt(self, model, name: str, *, context: int) -> torch.nn.Module:
        """A model of a type this family reads as its own (`spec.read_as`: Qwen2 and Mistral as Llama),
        rebuilt as this family's class with the same weights. Its config is the description's translation
        (`spec.translate`, which refuses what this family cannot compute, e.g. a sliding window shorter than
        `context`); a bias the source does not have is zero (Qwen2's o_proj has none, while Llama's
        attention_bias puts one on q, k, v and o). The logits are then compared on a few tokens (float32, the
        same attention kernel): more than 1e-5 apart is a GrowlmError naming the member, never a different
        model imported silently."""
        kind = model.config.model_type
        settings = self.spec.translate(model.config.to_dict(), name, context=context)
        config = self.config_class(**{k: v for k, v in settings.items() if k != "model_type"})
        config._attn_implementation = "sdpa"
        for key, value in config.to_dict().items():  # no dropout, as every model growlm trains
            if key.endswith(("dropout", "pdrop")) and isinstance(value, float):
                setattr(config, key, 0.0)
        config.use_cache = False
        ours = self.empty(config)
        missing, unexpected = ours.load_state_dict(model.state_dict(), strict=False, assign=True)
        zero = [k for k in missing if k.endswith(".bias")]
        other = [k for k in missing if k not in zero and not (k == "lm_head.weight" and config.tie_word_embeddings)]
        if other or unexpected:
            raise GrowlmError(f"{name}: a {kind!r} model whose weights are not a {self.name} model's (missing "
                              f"{(other or ['nothing'])[0]}, unexpected {(unexpected or ['nothing'])[0]}); growlm "
                              f"cannot read it as {self.name}")
        for key in zero:
            module = ours.get_submodule(key.rpartition(".")[0])
            module.bias = torch.nn.Parameter(torch.zeros(module.out_features))
        if config.tie_word_embeddings:
            ours.tie_weights()
        materialise_buffers(ours)
        left = [k for k, t in [*ours.named_parameters(), *ours.named_buffers()] if t.is_meta]
        if left:
            raise GrowlmError(f"{name}: a {kind!r} model whose weights do not fill a {self.name} model's ({left[0]} "
                              f"has none); growlm cannot read it as {self.name}")
        ours.eval()
        model.eval()
        n = min(32, context, config.max_position_embeddings)
        ids = torch.randint(0, config.vocab_size, (2, n), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            diff = (ours(ids).logits - model(ids).logits).abs().max().item()
        if not diff < 1e-5:
            raise GrowlmError(f"{name}: read as {self.name}, its logits differ from the {kind!r} model's by "
                              f"{diff:.3g} on {n} tokens (float32); growlm cannot read it as {self.name} exactly")
        log(f"{name}: a {kind!r} model, read as {self.name}: the same weights, and logits within {diff:.1g} of its "
            f"own on {n} tokens")
        return ours

    def state_dict(self, W: dict, config: PretrainedConfig | None = None) -> dict[str, torch.Tensor]:
        """The family's parameter names for weights `W` of a model with `config` (which a family whose
        names or layout depend on its sizes reads: a fused projection interleaved per head)."""
        raise NotImplementedError

    def pack(self, W: dict, config: PretrainedConfig) -> torch.nn.Module:
        """A model with `config` holding weights `W` (an untied head makes the config untied)."""
        if W["head"] is None and not config.tie_word_embeddings:
            raise GrowlmError("an untied config but no lm_head weight")
        if W["head"] is not None and config.tie_word_embeddings:
            config = config.__class__(**{**config.to_dict(), "tie_word_embeddings": False})
            config._attn_implementation = "sdpa"
        return load_into(self.empty(config), self.state_dict(W, config))

    # -- the pieces of a forward pass, for the masked forward -------------------------------------
    def blocks(self, model) -> list:
        raise NotImplementedError

    def set_blocks(self, model, blocks) -> None:
        """Replace the model's block list (a ModuleList; the Apollo schedule shares blocks this way)."""
        raise NotImplementedError

    def norms(self, block) -> tuple:
        """(norm before attention, norm before the MLP) of a block: modules with .weight (and .bias)."""
        raise NotImplementedError

    def final_norm(self, model):
        raise NotImplementedError

    def embed(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def attention(self, model, l: int, h: torch.Tensor, *, cross: dict | None, m_head) -> torch.Tensor:
        """Block l's attention output (after its output projection) on normed input h: query head
        outputs multiplied by `m_head` (h,) before the projection; weights between different members
        multiplied by `cross` factors."""
        raise NotImplementedError

    def mlp(self, model, l: int, h: torch.Tensor, *, cross: dict | None, m_mlp) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, model, x: torch.Tensor) -> torch.Tensor:
        return model.lm_head(x)


# ----------------------------------------------------------------------------------------------
# GPT-2
# ----------------------------------------------------------------------------------------------

class GPT2Family(Family):
    spec = GPT2
    model_class = GPT2LMHeadModel
    config_class = GPT2Config

    def config(self, shape: ModelShape, *, like=None) -> GPT2Config:
        base = {} if like is None else {k: v for k, v in like.to_dict().items()
                                         if k not in ("architectures", "_name_or_path", "transformers_version", "dtype",
                                                      "torch_dtype")}
        if like is None:
            base = dict(activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0, use_cache=False)
        base.update(self.spec.write(shape))
        config = GPT2Config(**base)
        config._attn_implementation = "sdpa"
        return config

    def unpack(self, model) -> dict:
        t = model.transformer
        d = model.config.n_embd
        blocks = []
        for blk in t.h:
            ca_w, ca_b = blk.attn.c_attn.weight.detach(), blk.attn.c_attn.bias.detach()
            blocks.append({
                "ln1_w": blk.ln_1.weight.detach(), "ln1_b": blk.ln_1.bias.detach(),
                "q_w": ca_w[:, :d], "k_w": ca_w[:, d:2 * d], "v_w": ca_w[:, 2 * d:],
                "q_b": ca_b[:d], "k_b": ca_b[d:2 * d], "v_b": ca_b[2 * d:],
                "o_w": blk.attn.c_proj.weight.detach(), "o_b": blk.attn.c_proj.bias.detach(),
                "ln2_w": blk.ln_2.weight.detach(), "ln2_b": blk.ln_2.bias.detach(),
                "fc_w": blk.mlp.c_fc.weight.detach(), "fc_b": blk.mlp.c_fc.bias.detach(),
                "gate_w": None, "gate_b": None,
                "pr_w": blk.mlp.c_proj.weight.detach(), "pr_b": blk.mlp.c_proj.bias.detach(),
            })
        tied = model.lm_head.weight is t.wte.weight or bool(getattr(model.config, "tie_word_embeddings", True))
        return {"wte": t.wte.weight.detach(), "wpe": t.wpe.weight.detach(),
                "lnf_w": t.ln_f.weight.detach(), "lnf_b": t.ln_f.bias.detach(),
                "head": None if tied else model.lm_head.weight.detach(), "blocks": blocks}

    def state_dict(self, W: dict, config=None) -> dict[str, torch.Tensor]:
        sd = {"transformer.wte.weight": W["wte"], "transformer.wpe.weight": W["wpe"],
              "transformer.ln_f.weight": W["lnf_w"], "transformer.ln_f.bias": W["lnf_b"]}
        for i, b in enumerate(W["blocks"]):
            p = f"transformer.h.{i}."
            sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = b["ln1_w"], b["ln1_b"]
            sd[p + "attn.c_attn.weight"] = torch.cat([b["q_w"], b["k_w"], b["v_w"]], 1)
            sd[p + "attn.c_attn.bias"] = torch.cat([b["q_b"], b["k_b"], b["v_b"]], 0)
            sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = b["o_w"], b["o_b"]
            sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = b["ln2_w"], b["ln2_b"]
            sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = b["fc_w"], b["fc_b"]
            sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = b["pr_w"], b["pr_b"]
        if W["head"] is not None:
            sd["lm_head.weight"] = W["head"]
        return sd

    # -- forward pieces (the same operations, in the same order, as GPT2Block) --------------------
    def blocks(self, model) -> list:
        return list(model.transformer.h)

    def set_blocks(self, model, blocks) -> None:
        model.transformer.h = blocks

    def norms(self, block) -> tuple:
        return block.ln_1, block.ln_2

    def final_norm(self, model):
        return model.transformer.ln_f

    def embed(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        t = model.transformer
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        return t.wte(input_ids) + t.wpe(pos)[None]

    def attention(self, model, l: int, h: torch.Tensor, *, cross: dict | None, m_head) -> torch.Tensor:
        blk = model.transformer.h[l]
        d, H = model.config.n_embd, model.config.n_head
        dh = d // H
        B, T = h.shape[:2]
        w = blk.attn.c_attn.weight
        if cross is not None:
            w = w * torch.cat([cross["q"], cross["k"], cross["v"]], 1).to(w.dtype)
        qkv = h @ w + blk.attn.c_attn.bias
        q, k, v = (z.reshape(B, T, H, dh).transpose(1, 2) for z in qkv.split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=blk.attn.scaling)
        if m_head is not None:
            a = a * m_head.to(a.dtype)[None, :, None, None]
        a = a.transpose(1, 2).reshape(B, T, d)
        w = blk.attn.c_proj.weight
        if cross is not None:
            w = w * cross["o"].to(w.dtype)
        return a @ w + blk.attn.c_proj.bias

    def mlp(self, model, l: int, h: torch.Tensor, *, cross: dict | None, m_mlp) -> torch.Tensor:
        blk = model.transformer.h[l]
        w = blk.mlp.c_fc.weight
        if cross is not None:
            w = w * cross["fc"].to(w.dtype)
        u = blk.mlp.act(h @ w + blk.mlp.c_fc.bias)
        if m_mlp is not None:
            u = u * m_mlp.to(u.dtype)
        w = blk.mlp.c_proj.weight
        if cross is not None:
            w = w * cross["pr"].to(w.dtype)
        return u @ w + blk.mlp.c_proj.bias


# ----------------------------------------------------------------------------------------------
# Llama
# ----------------------------------------------------------------------------------------------

class LlamaFamily(Family):
    spec = LLAMA
    model_class = LlamaForCausalLM
    config_class = LlamaConfig
    ROPE_THETA = 10000.0
    EPS = 1e-5

    def config(self, shape: ModelShape, *, like=None) -> LlamaConfig:
        if like is not None:
            base = {k: v for k, v in like.to_dict().items()
                    if k not in ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype")}
        else:
            base = dict(hidden_act="silu", rms_norm_eps=self.EPS, mlp_bias=False, attention_dropout=0.0,
                        rope_parameters={"rope_type": "default", "rope_theta": self.ROPE_THETA}, initializer_range=0.02,
                        bos_token_id=0, eos_token_id=0, pad_token_id=None, use_cache=False)
        base.update(self.spec.write(shape))
        config = LlamaConfig(**base)
        config._attn_implementation = "sdpa"
        return config

    def unpack(self, model) -> dict:
        m = model.model

        def t(lin):  # nn.Linear stores (out, in)
            return lin.weight.detach().T

        def b(lin):
            return _detach(lin.bias)

        blocks = []
        for blk in m.layers:
            a, p = blk.self_attn, blk.mlp
            blocks.append({
                "ln1_w": blk.input_layernorm.weight.detach(), "ln1_b": None,
                "q_w": t(a.q_proj), "q_b": b(a.q_proj), "k_w": t(a.k_proj), "k_b": b(a.k_proj),
                "v_w": t(a.v_proj), "v_b": b(a.v_proj), "o_w": t(a.o_proj), "o_b": b(a.o_proj),
                "ln2_w": blk.post_attention_layernorm.weight.detach(), "ln2_b": None,
                "fc_w": t(p.up_proj), "fc_b": b(p.up_proj), "gate_w": t(p.gate_proj), "gate_b": b(p.gate_proj),
                "pr_w": t(p.down_proj), "pr_b": b(p.down_proj),
            })
        tied = model.lm_head.weight is m.embed_tokens.weight or bool(model.config.tie_word_embeddings)
        return {"wte": m.embed_tokens.weight.detach(), "wpe": None, "lnf_w": m.norm.weight.detach(), "lnf_b": None,
                "head": None if tied else model.lm_head.weight.detach(), "blocks": blocks}

    def state_dict(self, W: dict, config=None) -> dict[str, torch.Tensor]:
        sd = {"model.embed_tokens.weight": W["wte"], "model.norm.weight": W["lnf_w"]}
        names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                 "gate": "mlp.gate_proj", "fc": "mlp.up_proj", "pr": "mlp.down_proj"}
        for i, b in enumerate(W["blocks"]):
            p = f"model.layers.{i}."
            sd[p + "input_layernorm.weight"] = b["ln1_w"]
            sd[p + "post_attention_layernorm.weight"] = b["ln2_w"]
            for key, name in names.items():
                sd[p + name + ".weight"] = b[key + "_w"].T
                if b.get(key + "_b") is not None:
                    sd[p + name + ".bias"] = b[key + "_b"]
        if W["head"] is not None:
            sd["lm_head.weight"] = W["head"]
        return sd

    # -- forward pieces (LlamaDecoderLayer's operations) ------------------------------------------
    def blocks(self, model) -> list:
        return list(model.model.layers)

    def set_blocks(self, model, blocks) -> None:
        model.model.layers = blocks

    def norms(self, block) -> tuple:
        return block.input_layernorm, block.post_attention_layernorm

    def final_norm(self, model):
        return model.model.norm

    def embed(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        return model.model.embed_tokens(input_ids)

    def _rotary(self, model, x: torch.Tensor, T: int):
        pos = torch.arange(T, device=x.device)[None]
        return model.model.rotary_emb(x, pos)

    def attention(self, model, l: int, h: torch.Tensor, *, cross: dict | None, m_head) -> torch.Tensor:
        attn = model.model.layers[l].self_attn
        c = model.config
        H, G, dh = c.num_attention_heads, c.num_key_value_heads, attn.head_dim
        B, T = h.shape[:2]

        def weight(lin, key):  # cross factors are (in, out); a Linear's weight is (out, in)
            return lin.weight if cross is None else lin.weight * cross[key].T.to(lin.weight.dtype)

        q = F.linear(h, weight(attn.q_proj, "q"), attn.q_proj.bias).reshape(B, T, H, dh).transpose(1, 2)
        k = F.linear(h, weight(attn.k_proj, "k"), attn.k_proj.bias).reshape(B, T, G, dh).transpose(1, 2)
        v = F.linear(h, weight(attn.v_proj, "v"), attn.v_proj.bias).reshape(B, T, G, dh).transpose(1, 2)
        cos, sin = self._rotary(model, h, T)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if G != H:  # query head i reads key/value head i // r (transformers' repeat_kv)
            k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling)
        if m_head is not None:
            a = a * m_head.to(a.dtype)[None, :, None, None]
        a = a.transpose(1, 2).reshape(B, T, H * dh)
        return F.linear(a, weight(attn.o_proj, "o"), attn.o_proj.bias)

    def mlp(self, model, l: int, h: torch.Tensor, *, cross: dict | None, m_mlp) -> torch.Tensor:
        p = model.model.layers[l].mlp

        def weight(lin, key):
            w = lin.weight
            return w if cross is None else w * cross[key].T.to(w.dtype)

        u = p.act_fn(F.linear(h, weight(p.gate_proj, "fc"), p.gate_proj.bias)) * F.linear(
            h, weight(p.up_proj, "fc"), p.up_proj.bias)
        if m_mlp is not None:
            u = u * m_mlp.to(u.dtype)
        return F.linear(u, weight(p.down_proj, "pr"), p.down_proj.bias)


FAMILY = {family.name: family for family in (GPT2Family(), LlamaFamily())}  # growlm.family_specs.FAMILY_SPECS' names


def family_of(obj) -> Family:
    """The family of a model, its config, a grown model (its inner model) or a `ModelShape`."""
    if isinstance(obj, ModelShape):
        return FAMILY[obj.family]
    obj = getattr(obj, "module", obj)
    obj = getattr(obj, "inner", obj)
    config = getattr(obj, "config", obj)
    model_type = getattr(config, "model_type", None)
    for family in FAMILY.values():
        if family.spec.model_type == model_type:
            return family
    raise GrowlmError(f"a {model_type!r} model: growlm grows {grown_model_types()} models")


def shape_of(obj) -> ModelShape:
    return ModelShape.of(getattr(obj, "inner", obj))


def build(shape: ModelShape, seed: int = 0, *, like: PretrainedConfig | None = None) -> torch.nn.Module:
    """A freshly initialised model of `shape` (the same seed gives the same weights)."""
    fam = FAMILY[shape.family]
    return fam.build(fam.config(shape, like=like), seed)


