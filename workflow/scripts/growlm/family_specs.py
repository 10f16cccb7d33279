"""Model families, each described once and torch-free: what every module that is not a model asks.

A `FamilySpec` says everything about a family that needs no torch: its Hugging Face `model_type` and
config keys (`read` turns a config.json, or a config object, into the fields of a
`growlm.shape.ModelShape`; `write` gives the config keys of a shape), its traits (norm kind, gated
MLP, position kind, biases, grouped-query attention), the `model.*` config keys it takes beyond the
shared ones with their defaults (`settings`), the tensors whose shapes its config fixes (`weights`,
the check of a member's safetensors header), and the per-block terms of the parameter count and the
activation memory (`block_params`, `root_params`, `activations`; the FLOPs formula of `growlm.flops`
needs only the traits: a gated MLP, and g / h). Its torch side - building models, the weight form, the
pieces of the masked forward - is one class in `growlm.families` (`FAMILY`, keyed by the same name).

The registry `FAMILY_SPECS` (name -> spec) is what `ModelShape`, the config checks, the members'
reading, the memory estimate and the growth chain ask instead of testing a family's name, so a new
family is its spec here (`register`), its class in `growlm.families` and its tests; nothing else.
`DEFAULT_FAMILY` is the family of a config that names none (`model.family` left out): its models'
settings carry no family key, so that a GPT-2 experiment's job params are what they were before
there were families, and nothing reruns.

Families whose blocks are Llama's and that differ from it only in configuration (Qwen2, Mistral
without a sliding window shorter than the context) are read as Llama: the llama spec's `read_as`
names them and its `translate` (`llama_config`) turns their config into a Llama config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from growlm.errors import GrowlmError

DEFAULT_FAMILY = "gpt2"

# what a family's `model.*` setting is for a model of a given shape (the members' settings, read back)
SETTING_OF_SHAPE = {
    "heads_per_kv": lambda s: s.r,
    "mlp_ratio": lambda s: s.f / s.d,
    "attention_bias": lambda s: s.attention_bias,
}

# growlm's names for what a family's config keys hold (`FamilySpec.keys` maps them to its own)
_REQUIRED = object()  # a config key without a default: a config that leaves it out describes no model
SHAPE_KEYS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_kv_head", "head_dim", "n_inner",
              "tie_word_embeddings", "attention_bias")


@dataclass(frozen=True)
class FamilySpec:
    """One model family, torch-free (see the module docstring)."""

    name: str  # growlm's name (model.family)
    model_type: str  # the Hugging Face model_type of its config
    architecture: str  # the transformers class its saved models load as
    norm: str  # "layernorm" (mean and variance, a weight and a bias) | "rmsnorm" (mean square, a weight)
    gated: bool  # gated MLP: down(act(gate x) * up x); else proj(act(fc x))
    positions: str  # "learned" (a position table, T x d) | "rotary" (per head, no parameters)
    biases: bool  # biases on every projection (q, k, v, o, fc, proj); else only with `attention_bias`
    grouped_query: bool  # may have fewer key/value heads than query heads
    keys: Mapping[str, str]  # growlm's name (SHAPE_KEYS, "activation", "eps") -> the config's key
    defaults: Mapping[str, Any]  # growlm's name -> the value transformers takes when config.json leaves it out
    activations: Callable  # (shape, s_a, s_r) -> bytes per token: (a block's saved, its backward's transient,
    #                        the final norm's saved); growlm.memory.estimate's terms
    weights: Callable  # shape -> [(tensor name suffix, dims, what the config calls them)] its config fixes
    settings: Mapping[str, Any] = field(default_factory=dict)  # model.* keys beyond the shared ones: defaults
    lacks: str = ""  # what it has instead of the settings of other families, for a message
    fixed: Mapping[str, Any] = field(default_factory=dict)  # config keys the family requires, and their values
    read_as: Mapping[str, str] = field(default_factory=dict)  # other model types read as this family: why
    translate: Callable | None = None  # (config dict, where, context) -> this family's config dict

    @property
    def traits(self) -> dict:
        return {"norm": self.norm, "gated": self.gated, "positions": self.positions, "biases": self.biases}

    # -- a Hugging Face config ------------------------------------------------------------------
    def read(self, config, where: str = "a model") -> dict:
        """The `ModelShape` fields of a config of this family: a config.json's dict or a config object
        (a key left out takes transformers' default, `defaults`). GrowlmError for heads that do not fill
        the width (growlm grows models with head_dim x heads = width) or a `fixed` key of another value."""
        def get(key, default=_REQUIRED):  # a key with no default must be there (KeyError, AttributeError)
            if isinstance(config, Mapping):
                return config[key] if default is _REQUIRED else config.get(key, default)
            return getattr(config, key) if default is _REQUIRED else getattr(config, key, default)

        for key, value in self.fixed.items():
            if get(key, value) != value:  # left out: the family's own value
                raise GrowlmError(f"{where}: a {self.name} model with {key} = {get(key)!r}; growlm grows {self.name} "
                                  f"models with {key} = {value!r}")
        k = self.keys
        d, h = get(k["n_embd"]), get(k["n_head"])
        dh = (get(k["head_dim"], None) if "head_dim" in k else None) or d // h
        if dh * h != d:
            raise GrowlmError(f"{where}: {h} heads of {dh} do not make its width {d}; growlm grows models whose heads "
                              f"fill the width")
        out = {"family": self.name, "n_embd": d, "n_layer": get(k["n_layer"]), "n_head": h,
               "vocab_size": get(k["vocab_size"]),
               "n_positions": get(k["n_positions"], self.defaults.get("n_positions", _REQUIRED)),
               "n_inner": get(k["n_inner"], self.defaults.get("n_inner", _REQUIRED)),
               "tie_word_embeddings": bool(get(k["tie_word_embeddings"], self.defaults.get("tie_word_embeddings",
                                                                                           _REQUIRED)))}
        if "n_kv_head" in k:
            out["n_kv_head"] = get(k["n_kv_head"], None) or h
        if "attention_bias" in k:
            out["attention_bias"] = bool(get(k["attention_bias"], self.defaults.get("attention_bias", False)))
        return out

    def write(self, shape) -> dict:
        """The config keys that say `shape` (the rest of a config is the family's class's defaults, or a
        member's). An MLP width the family's config may leave out (default None: 4 d) is written as the
        shape has it, so that a config says what it said before."""
        values = {"vocab_size": shape.V, "n_positions": shape.T, "n_embd": shape.d, "n_layer": shape.L,
                  "n_head": shape.h, "n_kv_head": shape.g, "head_dim": shape.dh,
                  "n_inner": shape.n_inner if self.defaults.get("n_inner", 0) is None else shape.f,
                  "tie_word_embeddings": shape.tied, "attention_bias": shape.attention_bias}
        out = {key: values[name] for name, key in self.keys.items() if name in values}
        out.update(self.fixed)
        return out

    def shape_settings(self, shape) -> dict:
        """The family's `model.*` settings that make a model of `shape` (pretrained members' own)."""
        return {key: SETTING_OF_SHAPE[key](shape) for key in self.settings}

    # -- parameter counts -----------------------------------------------------------------------
    def block_params(self, s) -> int:
        """One block: q and o (d x d), k and v (d x g dh), the MLP's two or three d x f matrices, two
        norms (a weight, and a bias for LayerNorm) and the biases the family has (all projections', or
        q, k, v and o's with attention_bias)."""
        d, f = s.d, s.f
        matrices = 2 * d * d + 2 * d * s.g * s.dh + (3 if self.gated else 2) * d * f
        norms = 2 * (2 * d if self.norm == "layernorm" else d)
        attention_bias = d + 2 * s.g * s.dh + d if self.biases or s.attention_bias else 0
        mlp_bias = f + d if self.biases else 0
        return matrices + norms + attention_bias + mlp_bias

    def root_params(self, s) -> int:
        """What is not in a block: the token embedding, a learned position table, the final norm and an
        untied head."""
        d = s.d
        positions = s.T * d if self.positions == "learned" else 0
        norm = 2 * d if self.norm == "layernorm" else d
        return s.V * d + positions + norm + (0 if s.tied else s.V * d)


FAMILY_SPECS: dict[str, FamilySpec] = {}


def register(spec: FamilySpec) -> FamilySpec:
    """Add a family to the registry (its torch class goes into growlm.families.FAMILY under the same name)."""
    FAMILY_SPECS[spec.name] = spec
    return spec


def family_spec(name: str) -> FamilySpec:
    """The spec of family `name`; GrowlmError naming the families growlm grows."""
    if name not in FAMILY_SPECS:
        raise GrowlmError(f"model family {name!r}: growlm grows {' and '.join(FAMILY_SPECS)}")
    return FAMILY_SPECS[name]


def spec_for_model_type(model_type: str | None, *, read_as: bool = False) -> FamilySpec | None:
    """The family whose config has `model_type` (with `read_as`, also the family that reads it: a Qwen2
    config is read as llama); None for a model type growlm does not grow."""
    for spec in FAMILY_SPECS.values():
        if spec.model_type == model_type or (read_as and model_type in spec.read_as):
            return spec
    return None


def grown_model_types() -> str:
    """The model types growlm grows, for messages: 'gpt2 and llama'."""
    return " and ".join(FAMILY_SPECS)


# ----------------------------------------------------------------------------------------------
# GPT-2
# ----------------------------------------------------------------------------------------------

def gpt2_activations(s, s_a: int, s_r: int) -> tuple[int, int, int]:
    """HF GPT2Block with SDPA, dropout 0 (growlm.memory.estimate's docstring derives it): the block
    input and the residual before ln_2 (s_r d each), ln_1 out, q, k, v, the SDPA output and ln_2 out
    (6 s_a d), c_fc out and GELU out (2 s_a f), SDPA's logsumexp (4 h) and two LayerNorms' statistics
    (16); the backward's transient is the MLP's gradients and the incoming gradient; ln_f keeps its
    input and statistics."""
    d, f, h = s.d, s.f, s.h
    a_block = (2 * s_r + 6 * s_a) * d + 2 * s_a * f + 4 * h + 16
    a_trans = 2 * s_a * f + s_r * d
    return a_block, a_trans, s_r * d + 8


def gpt2_weights(s) -> list[tuple[str, tuple, str]]:
    return [("wte.weight", (s.V, s.d), "vocab_size x n_embd"), ("wpe.weight", (s.T, s.d), "n_positions x n_embd"),
            ("h.0.attn.c_attn.weight", (s.d, 3 * s.d), "n_embd x 3 n_embd"),
            ("h.0.mlp.c_fc.weight", (s.d, s.f), "n_embd x n_inner")]


GPT2 = register(FamilySpec(
    name="gpt2", model_type="gpt2", architecture="GPT2LMHeadModel",
    norm="layernorm", gated=False, positions="learned", biases=True, grouped_query=False,
    keys={"vocab_size": "vocab_size", "n_positions": "n_positions", "n_embd": "n_embd", "n_layer": "n_layer",
          "n_head": "n_head", "n_inner": "n_inner", "tie_word_embeddings": "tie_word_embeddings",
          "activation": "activation_function", "eps": "layer_norm_epsilon"},
    defaults={"n_positions": 1024, "n_inner": None, "tie_word_embeddings": True},
    activations=gpt2_activations, weights=gpt2_weights,
    lacks="one key/value head per query head, a 4 d MLP and biases",
))


# ----------------------------------------------------------------------------------------------
# Llama (and the families read as Llama)
# ----------------------------------------------------------------------------------------------

def llama_activations(s, s_a: int, s_r: int) -> tuple[int, int, int]:
    """What transformers' LlamaDecoderLayer keeps with SDPA (grouped-query attention inside SDPA, no
    repeated key/value heads) - growlm.memory.estimate's docstring derives it."""
    d, f, h, kv = s.d, s.f, s.h, s.g * s.dh
    rms = 2 * s_r * d + 4  # RMSNorm (eager, in fp32): its input and the normalised value, and 1/rms
    a_block = (2 * rms  # two norms
               + s_a * (d + d + 2 * kv)  # norm output (kept by q/k/v), q and k after rotary, v (kept by SDPA)
               + s_a * d + 4 * h  # SDPA output (kept by o_proj) and its logsumexp
               + s_a * d  # second norm's output (kept by gate and up)
               + 4 * s_a * f)  # gate out (kept by SiLU), SiLU out and up out (kept by the product), product
    a_trans = 3 * s_a * f + s_r * d  # the gated MLP's gradients and the incoming gradient
    return a_block, a_trans, rms


def llama_weights(s) -> list[tuple[str, tuple, str]]:
    return [("embed_tokens.weight", (s.V, s.d), "vocab_size x hidden_size"),
            ("lm_head.weight", (s.V, s.d), "vocab_size x hidden_size"),
            ("layers.0.self_attn.q_proj.weight", (s.h * s.dh, s.d), "num_attention_heads x head_dim, hidden_size"),
            ("layers.0.self_attn.k_proj.weight", (s.g * s.dh, s.d), "num_key_value_heads x head_dim, hidden_size"),
            ("layers.0.mlp.up_proj.weight", (s.f, s.d), "intermediate_size x hidden_size")]


# families whose blocks are Llama's, differing from it only in configuration: read as llama, exactly
READ_AS_LLAMA = {
    "qwen2": "biases on the q, k and v projections: Llama's attention_bias, with a zero bias on o",
    "mistral": "a sliding attention window: Llama's full attention when the window spans model.context",
}
# what a Llama config takes from theirs (the rest is Llama's default, or set by llama_config)
LLAMA_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "initializer_range",
              "rms_norm_eps", "rope_parameters", "rope_theta", "rope_scaling", "attention_dropout",
              "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")
# transformers' defaults for a key a config.json leaves out, where they differ from Llama's
READ_AS_LLAMA_DEFAULTS = {
    "qwen2": {"num_key_value_heads": 32, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6},
    "mistral": {"num_key_value_heads": 8, "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6,
                "bos_token_id": 1, "eos_token_id": 2},
}


def sliding_window(cfg: dict) -> int | None:
    """The attention window of a member's sliding-window layers as transformers reads its config, or
    None when every layer attends to the whole context. Mistral: `sliding_window` on every layer (4096
    when the key is absent, MistralConfig's default; null: none). Qwen2: only with `use_sliding_window`,
    on the layers its `layer_types` mark `sliding_attention` (without them: from `max_window_layers` on)."""
    family = cfg.get("model_type")
    if family == "mistral":
        return cfg.get("sliding_window", 4096)
    if family == "qwen2" and cfg.get("use_sliding_window") and cfg.get("sliding_window", 4096) is not None:
        layers = cfg.get("layer_types") or ["sliding_attention" if i >= cfg.get("max_window_layers", 28) else
                                            "full_attention" for i in range(cfg["num_hidden_layers"])]
        return cfg.get("sliding_window", 4096) if "sliding_attention" in layers else None
    return None


def llama_config(cfg: dict, where: str, *, context: int | None) -> dict:
    """The Llama config (LlamaConfig's keys) of a member whose family is read as Llama (READ_AS_LLAMA);
    a Llama config as it is. Torch-free, for the config check, and the one translation the import job
    builds its LlamaForCausalLM from (then checking that its logits are the member's).

    Qwen2's attention has biases on q, k and v and none on o; Llama's `attention_bias` puts them on all
    four, so the Llama form has a zero o bias, which adds nothing: the same function. Mistral is Llama
    with a sliding window: a token attends to the `sliding_window` tokens up to itself, so a window of at
    least `context` tokens (the longest sequence growlm trains and evaluates on) is full causal attention
    and the same function; a shorter one is not, and the member is refused (GrowlmError). `context`
    None: the translation only, unchecked (what an imported member's config already is)."""
    family = cfg.get("model_type")
    if family not in READ_AS_LLAMA:
        return cfg
    window = sliding_window(cfg)
    if window is not None and context is not None and window < context:
        raise GrowlmError(f"{where}: a {family!r} model with a sliding attention window of {window} tokens, shorter "
                          f"than model.context = {context}; growlm's Llama models attend to the whole context, so "
                          f"it would not be the same model: use model.context <= {window}, or a member without a "
                          f"sliding window")
    out = {**READ_AS_LLAMA_DEFAULTS.get(family, {}), **{k: cfg[k] for k in LLAMA_KEYS if cfg.get(k) is not None}}
    out.update(model_type=LLAMA.model_type, architectures=[LLAMA.architecture], attention_bias=family == "qwen2",
               mlp_bias=False)
    return out


LLAMA = register(FamilySpec(
    name="llama", model_type="llama", architecture="LlamaForCausalLM",
    norm="rmsnorm", gated=True, positions="rotary", biases=False, grouped_query=True,
    keys={"vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_hidden_layers",
          "n_head": "num_attention_heads", "n_kv_head": "num_key_value_heads", "head_dim": "head_dim",
          "n_inner": "intermediate_size", "n_positions": "max_position_embeddings",
          "tie_word_embeddings": "tie_word_embeddings", "attention_bias": "attention_bias",
          "activation": "hidden_act", "eps": "rms_norm_eps"},
    defaults={"n_positions": 2048, "tie_word_embeddings": False, "attention_bias": False},
    activations=llama_activations, weights=llama_weights,
    settings={"heads_per_kv": 2, "mlp_ratio": 3, "attention_bias": False},
    read_as=READ_AS_LLAMA, translate=llama_config,
))
