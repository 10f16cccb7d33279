"""The shape of a model: the one description of its size that every layer shares.

`ModelShape` holds what a model's config says about size (width, depth, heads and key/value heads,
MLP width, vocabulary, positions, tied head) and its family (`gpt2`: LayerNorm with bias, learned
positions, a GELU MLP, one key/value head per query head; `llama`: RMSNorm without bias, rotary
positions, a gated SiLU MLP, grouped-query attention), and nothing else. What a family is (its traits,
its config keys, its parameter count) is its description in `growlm.family_specs` (`ModelShape.spec`),
so this module tests no family by name. It is torch-free, so the
workflow can check an experiment's growth chains while it parses the Snakefile, and the memory
planner and the FLOPs formula can size a model that does not exist yet. Field names are GPT-2's
(Hugging Face maps them to `hidden_size`, `num_hidden_layers`, ... for every family); the short
read-only aliases (`d`, `L`, `h`, `g`, `r`, `dh`, `f`, `V`, `T`, `tied`) are the letters of the algebra
in the growth operators' docstrings.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from growlm.errors import GrowlmError
from growlm.family_specs import DEFAULT_FAMILY, FAMILY_SPECS, family_spec, grown_model_types, spec_for_model_type


# the families growlm ships (the default of an operator's `families`); each is described once, torch-free, by its
# growlm.family_specs.FamilySpec (ModelShape.spec), and built by its class in growlm.families
FAMILIES = tuple(FAMILY_SPECS)


def mlp_units(n_embd: int, ratio: float) -> int:
    """The MLP width of a model of width `n_embd` at `ratio` units per residual coordinate (an
    integer: growth scales it with the width, so f1 / f0 = d1 / d0 exactly)."""
    f = ratio * n_embd
    if abs(f - round(f)) > 1e-9:
        raise GrowlmError(f"model.mlp_ratio = {ratio} gives {f:g} MLP units at width {n_embd}, not a whole number")
    return int(round(f))


def regrouped_r(n: int, h0: int, r: int, h1: int) -> int:
    """Query heads per key/value head of h1 query heads grown from n members of h0 heads, r per key/value
    head: r when h1 is whole groups of r; else the largest r' <= r dividing h1 such that each member's
    source group fits in whole groups of r' (ceil(r / r') of them), its key/value head duplicated for
    each (growlm.growth.width.regrouped_heads); r' = 1 always fits."""
    if h1 % r == 0:
        return r
    for r_new in range(min(r, h1), 1, -1):
        if h1 % r_new == 0 and n * (h0 // r) * -(-r // r_new) <= h1 // r_new:
            return r_new
    return 1


@dataclass(frozen=True)
class ModelShape:
    n_embd: int  # residual width d
    n_layer: int  # blocks L
    n_head: int  # attention heads h (head size dh = d / h)
    vocab_size: int  # V
    n_positions: int = 1024  # T: learned position embeddings (gpt2), the longest context (llama)
    n_inner: int | None = None  # MLP width f; None = 4 d (GPT-2's default)
    tie_word_embeddings: bool = True  # LM head = token embedding
    family: str = DEFAULT_FAMILY  # a name of growlm.family_specs.FAMILY_SPECS
    n_kv_head: int | None = None  # key/value heads g (grouped-query attention); None = n_head
    attention_bias: bool = False  # llama: biases on q, k, v and o (the Qwen2-style variant)

    def __post_init__(self):
        spec = family_spec(self.family)
        if self.n_head <= 0 or self.n_embd % self.n_head:
            raise GrowlmError(f"width {self.n_embd} is not divisible into {self.n_head} heads")
        if self.g <= 0 or self.n_head % self.g:
            raise GrowlmError(f"{self.n_head} query heads cannot share {self.g} key/value heads evenly "
                              f"(the query heads per key/value head must be a whole number)")
        if not spec.grouped_query and self.g != self.n_head:
            raise GrowlmError(f"{self.family} has one key/value head per query head (no grouped-query attention)")

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
        model_type = getattr(config, "model_type", DEFAULT_FAMILY)
        spec = spec_for_model_type(model_type)
        if spec is None:
            raise GrowlmError(f"a {model_type!r} model: growlm grows {grown_model_types()} models")
        return cls(**spec.read(config, f"a {spec.name} model"))

    def resized(self, *, n_embd: int, n_layer: int, n_head: int) -> "ModelShape":
        """The shape grown to a new width, depth and head count: a set MLP width scales with d, and the
        key/value heads with the query heads (the query heads per key/value head are kept)."""
        inner = None if self.n_inner is None else self.n_inner * n_embd // self.n_embd
        kv = None if self.n_kv_head is None else n_head // regrouped_r(1, self.h, self.r, n_head)
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
    def spec(self):
        """The family's description (growlm.family_specs.FamilySpec)."""
        return FAMILY_SPECS[self.family]

    @property
    def traits(self) -> dict:
        return self.spec.traits

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
        """Parameters of one block (the family's count: growlm.family_specs.FamilySpec.block_params)."""
        return self.spec.block_params(self)

    @property
    def root_params(self) -> int:
        """Embeddings, the final norm and an untied head: what is not in a block."""
        return self.spec.root_params(self)

    @property
    def n_params(self) -> int:
        return self.n_layer * self.block_params + self.root_params

    @property
    def embedding_params(self) -> int:
        """The token embedding, a learned position table and an untied head: what a count of
        non-embedding parameters (`n_params - embedding_params`, Kaplan et al.'s N) leaves out."""
        positions = self.T * self.d if self.learned_positions else 0
        return self.V * self.d * (1 if self.tied else 2) + positions
