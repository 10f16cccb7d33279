"""The shape of a model: the one description of its size that every layer shares.

`ModelShape` holds what a model's config says about size (width, depth, heads and key/value heads,
MLP width, vocabulary, positions, tied head) and its family (`gpt2`: LayerNorm with bias, learned
positions, a GELU MLP, one key/value head per query head; `llama`: RMSNorm without bias, rotary
positions, a gated SiLU MLP, grouped-query attention), and nothing else. It is torch-free, so the
workflow can check an experiment's growth chains while it parses the Snakefile, and the memory
planner and the FLOPs formula can size a model that does not exist yet. Field names are GPT-2's
(Hugging Face maps them to `hidden_size`, `num_hidden_layers`, ... for every family); the short
read-only aliases (`d`, `L`, `h`, `g`, `r`, `dh`, `f`, `V`, `T`, `tied`) are the letters of the algebra
in the growth operators' docstrings.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from growlm.errors import GrowlmError


FAMILIES = ("gpt2", "llama")
# what distinguishes the families, for code that needs no torch (the rest is in growlm.families)
FAMILY_TRAITS = {
    "gpt2": {"norm": "layernorm", "gated": False, "positions": "learned", "biases": True},
    "llama": {"norm": "rmsnorm", "gated": True, "positions": "rotary", "biases": False},
}


def mlp_units(n_embd: int, ratio: float) -> int:
    """The MLP width of a model of width `n_embd` at `ratio` units per residual coordinate (an
    integer: growth scales it with the width, so f1 / f0 = d1 / d0 exactly)."""
    f = ratio * n_embd
    if abs(f - round(f)) > 1e-9:
        raise GrowlmError(f"model.mlp_ratio = {ratio} gives {f:g} MLP units at width {n_embd}, not a whole number")
    return int(round(f))


@dataclass(frozen=True)
class ModelShape:
    n_embd: int  # residual width d
    n_layer: int  # blocks L
    n_head: int  # attention heads h (head size dh = d / h)
    vocab_size: int  # V
    n_positions: int = 1024  # T: learned position embeddings (gpt2), the longest context (llama)
    n_inner: int | None = None  # MLP width f; None = 4 d (GPT-2's default)
    tie_word_embeddings: bool = True  # LM head = token embedding
    family: str = "gpt2"  # gpt2 | llama
    n_kv_head: int | None = None  # key/value heads g (grouped-query attention); None = n_head
    attention_bias: bool = False  # llama: biases on q, k, v and o (the Qwen2-style variant)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise GrowlmError(f"model family {self.family!r}: growlm grows {' and '.join(FAMILIES)}")
        if self.n_head <= 0 or self.n_embd % self.n_head:
            raise GrowlmError(f"width {self.n_embd} is not divisible into {self.n_head} heads")
        if self.g <= 0 or self.n_head % self.g:
            raise GrowlmError(f"{self.n_head} query heads cannot share {self.g} key/value heads evenly "
                              f"(the query heads per key/value head must be a whole number)")
        if self.family == "gpt2" and self.g != self.n_head:
            raise GrowlmError("gpt2 has one key/value head per query head (no grouped-query attention)")

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def of(cls, obj) -> "ModelShape":
        """From a ModelShape, a model's config (GPT2Config, LlamaConfig), a model (its `.config`; DDP's
        `.module` and a grown model's inner model unwrapped) or a dict with the field names
        (`head_dim` instead of `n_head`, `heads_per_kv` instead of `n_kv_head` and `mlp_ratio` instead
        of `n_inner` are accepted: growlm.experiment.model_settings)."""
        if isinstance(obj, ModelShape):
            return obj
        if isinstance(obj, dict):
            d = dict(obj)
            if "n_head" not in d and "head_dim" in d:
                d["n_head"] = max(1, d["n_embd"] // d["head_dim"])
            if "n_kv_head" not in d and d.get("heads_per_kv"):
                d["n_kv_head"] = max(1, d["n_head"] // int(d["heads_per_kv"]))
            if d.get("n_inner") is None and d.get("mlp_ratio") is not None:
                d["n_inner"] = mlp_units(d["n_embd"], d["mlp_ratio"])
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in d.items() if k in known and v is not None})
        obj = getattr(obj, "module", obj)  # DDP wrapper
        config = getattr(obj, "config", obj)
        family = getattr(config, "model_type", "gpt2")
        if family == "llama":
            d, h = config.hidden_size, config.num_attention_heads
            head_dim = getattr(config, "head_dim", None) or d // h
            if head_dim * h != d:
                raise GrowlmError(f"a llama model whose heads ({h} of {head_dim}) do not add up to its width {d}: "
                                  f"growlm grows models with head_dim x heads = width")
            return cls(n_embd=d, n_layer=config.num_hidden_layers, n_head=h, vocab_size=config.vocab_size,
                       n_positions=config.max_position_embeddings, n_inner=config.intermediate_size,
                       tie_word_embeddings=bool(config.tie_word_embeddings), family="llama",
                       n_kv_head=config.num_key_value_heads, attention_bias=bool(config.attention_bias))
        if family != "gpt2":
            raise GrowlmError(f"a {family!r} model: growlm grows {' and '.join(FAMILIES)} models")
        return cls(n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
                   vocab_size=config.vocab_size, n_positions=config.n_positions,
                   n_inner=getattr(config, "n_inner", None),
                   tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)))

    def resized(self, *, n_embd: int, n_layer: int, n_head: int) -> "ModelShape":
        """The shape grown to a new width, depth and head count: a set MLP width scales with d, and the
        key/value heads with the query heads (the query heads per key/value head are kept)."""
        inner = None if self.n_inner is None else self.n_inner * n_embd // self.n_embd
        kv = None if self.n_kv_head is None else max(1, n_head // self.r)
        return replace(self, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_inner=inner, n_kv_head=kv)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # -- the algebra's letters ------------------------------------------------------------------
    @property
    def d(self) -> int:
        return self.n_embd

    @property
    def L(self) -> int:  # noqa: N802 (the letter of the algebra)
        return self.n_layer

    @property
    def h(self) -> int:
        return self.n_head

    @property
    def g(self) -> int:
        """Key/value heads."""
        return self.n_kv_head or self.n_head

    @property
    def r(self) -> int:
        """Query heads per key/value head (1: multi-head attention)."""
        return self.n_head // self.g

    @property
    def dh(self) -> int:
        return self.n_embd // self.n_head

    @property
    def f(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @property
    def traits(self) -> dict:
        return FAMILY_TRAITS[self.family]

    @property
    def gated(self) -> bool:
        return self.traits["gated"]

    @property
    def norm(self) -> str:
        return self.traits["norm"]

    @property
    def learned_positions(self) -> bool:
        return self.traits["positions"] == "learned"

    @property
    def V(self) -> int:  # noqa: N802
        return self.vocab_size

    @property
    def T(self) -> int:  # noqa: N802
        return self.n_positions

    @property
    def tied(self) -> bool:
        return self.tie_word_embeddings

    # -- parameter counts (the memory estimate) -------------------------------------------------
    @property
    def attention_params(self) -> int:
        """Matrix weights of one block's attention: q and o (d x h dh each), k and v (d x g dh each)."""
        return 2 * self.d * self.d + 2 * self.d * self.g * self.dh

    @property
    def mlp_params(self) -> int:
        """Matrix weights of one block's MLP: fc and proj, plus the gate of a gated MLP."""
        return (3 if self.gated else 2) * self.d * self.f

    @property
    def block_params(self) -> int:
        d, f = self.d, self.f
        if self.family == "gpt2":
            return 4 * d * d + 2 * d * f + 9 * d + f  # ln_1, c_attn, c_proj, ln_2, c_fc, mlp c_proj
        bias = d + 2 * self.g * self.dh + d if self.attention_bias else 0  # q, k, v, o
        return self.attention_params + self.mlp_params + 2 * d + bias  # two RMSNorm weights

    @property
    def root_params(self) -> int:
        """Embeddings, the final norm and an untied head: what is not in a block."""
        d = self.d
        head = 0 if self.tied else self.V * d
        if self.family == "gpt2":
            return self.V * d + self.T * d + 2 * d + head
        return self.V * d + d + head

    @property
    def n_params(self) -> int:
        return self.n_layer * self.block_params + self.root_params
