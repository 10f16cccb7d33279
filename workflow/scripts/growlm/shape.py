"""The shape of a GPT-2: the one description of a model's size that every layer shares.

`ModelShape` holds what a `transformers.GPT2Config` says about size (width, depth, heads, MLP width,
vocabulary, positions, tied head) and nothing else. It is torch-free, so the workflow can check an
experiment's growth chains while it parses the Snakefile, and the memory planner can estimate a
model that does not exist yet. Field names are Hugging Face's; the short read-only aliases (`d`, `L`,
`h`, `dh`, `f`, `V`, `T`, `tied`) are the letters of the algebra in the growth operators' docstrings.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from growlm.errors import GrowlmError


@dataclass(frozen=True)
class ModelShape:
    n_embd: int  # residual width d
    n_layer: int  # blocks L
    n_head: int  # attention heads h (head size dh = d / h)
    vocab_size: int  # V
    n_positions: int = 1024  # T, learned position embeddings
    n_inner: int | None = None  # MLP width f; None = 4 d (GPT-2's default)
    tie_word_embeddings: bool = True  # LM head = token embedding

    def __post_init__(self):
        if self.n_head <= 0 or self.n_embd % self.n_head:
            raise GrowlmError(f"width {self.n_embd} is not divisible into {self.n_head} heads")

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def of(cls, obj) -> "ModelShape":
        """From a ModelShape, a GPT2Config, a model (its `.config`; DDP's `.module` unwrapped) or a
        dict with GPT2Config's keys (`head_dim` instead of `n_head` is accepted)."""
        if isinstance(obj, ModelShape):
            return obj
        if isinstance(obj, dict):
            d = dict(obj)
            if "n_head" not in d and "head_dim" in d:
                d["n_head"] = max(1, d["n_embd"] // d["head_dim"])
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in d.items() if k in known})
        obj = getattr(obj, "module", obj)  # DDP wrapper
        config = getattr(obj, "config", obj)
        return cls(n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
                   vocab_size=config.vocab_size, n_positions=config.n_positions,
                   n_inner=getattr(config, "n_inner", None),
                   tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)))

    def resized(self, *, n_embd: int, n_layer: int, n_head: int) -> "ModelShape":
        """The shape grown to a new width, depth and head count (a set MLP width scales with d)."""
        inner = None if self.n_inner is None else self.n_inner * n_embd // self.n_embd
        return ModelShape(n_embd=n_embd, n_layer=n_layer, n_head=n_head, vocab_size=self.vocab_size,
                          n_positions=self.n_positions, n_inner=inner,
                          tie_word_embeddings=self.tie_word_embeddings)

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
    def dh(self) -> int:
        return self.n_embd // self.n_head

    @property
    def f(self) -> int:
        return self.n_inner or 4 * self.n_embd

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
    def block_params(self) -> int:
        d, f = self.d, self.f
        return 4 * d * d + 2 * d * f + 9 * d + f  # ln_1, c_attn, c_proj, ln_2, c_fc, mlp c_proj

    @property
    def root_params(self) -> int:
        """Embeddings, the final LayerNorm and an untied head: what is not in a block."""
        d = self.d
        head = 0 if self.tied else self.V * d
        return self.V * d + self.T * d + 2 * d + head

    @property
    def n_params(self) -> int:
        return self.n_layer * self.block_params + self.root_params
