"""Building, saving and loading the models every stage uses (Hugging Face `transformers`).

All models of one experiment share the family (`model.family`: GPT-2 or Llama, `growlm.families`),
the tokenizer (so the vocabulary), the context length and the head size; they differ in width
`n_embd` and depth `n_layer`. GPT-2's defaults follow what is fast on a CPU: `gelu` (not
`gelu_new`), no dropout, SDPA attention; Llama's are transformers' own (SiLU, RMSNorm eps 1e-5,
rotary base 10000) with SDPA. `enable_recompute` switches on activation recomputation for some
blocks (the memory plan's choice); `LogitEnsemble` is the members' untrained logit average, the
control that tells what the members know before any growth.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
from transformers.modeling_outputs import CausalLMOutput

from growlm.errors import GrowlmError, check_recorded_sha256, damaged, record_sha256
from growlm.families import build, family_of
from growlm.shape import ModelShape
from growlm.tokenizer import copy_tokenizer


def gpt2_config(
    *,
    n_embd: int,
    n_layer: int,
    vocab_size: int,
    n_positions: int,
    n_head: int | None = None,
    head_dim: int = 16,
    tie_word_embeddings: bool = True,
    activation_function: str = "gelu",
    dropout: float = 0.0,
    bos_token_id: int = 0,
    eos_token_id: int = 0,
) -> GPT2Config:
    """A GPT2Config for width `n_embd`, depth `n_layer`; heads = n_embd / head_dim unless given."""
    if n_head is None:
        if n_embd % head_dim:
            raise GrowlmError(f"width {n_embd} is not a multiple of the head size {head_dim}")
        n_head = n_embd // head_dim
    if n_embd % n_head:
        raise GrowlmError(f"width {n_embd} is not divisible by n_head={n_head}")
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        activation_function=activation_function,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        use_cache=False,
    )
    config._attn_implementation = "sdpa"
    return config


def gpt2_config_of(shape: ModelShape) -> GPT2Config:
    """The GPT2Config of a `ModelShape` (growlm's other defaults: gelu, no dropout, SDPA)."""
    return gpt2_config(n_embd=shape.n_embd, n_layer=shape.n_layer, vocab_size=shape.vocab_size,
                       n_positions=shape.n_positions, n_head=shape.n_head,
                       tie_word_embeddings=shape.tie_word_embeddings)


def build_model(seed: int = 0, *, family: str = "gpt2", like: str | Path | None = None, **config_kwargs):
    """A freshly initialised model; the same seed gives the same weights. `config_kwargs` are
    `growlm.experiment.model_settings` (width, depth, head size, ...) and the vocabulary size.
    `like`: a model folder (a pretrained member) whose config, resized, the new model takes
    (its family, activation, norm epsilon, rotary base...)."""
    if like is not None:
        template = AutoConfig.from_pretrained(like)
        shape = ModelShape.of(template)
        s = ModelShape.of({**config_kwargs, "family": shape.family})
        config = family_of(template).resized(template, n_embd=s.d, n_layer=s.L, n_head=s.d // shape.dh)
        return family_of(config).build(config, seed)
    if family == "gpt2":  # growlm's GPT-2 (gpt2_config), exactly as it has always been built
        config = gpt2_config(**{k: v for k, v in config_kwargs.items() if k not in ("heads_per_kv", "mlp_ratio")})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return GPT2LMHeadModel(config)
    return build(ModelShape.of({**config_kwargs, "family": family}), seed)


def n_params(model: torch.nn.Module, *, non_embedding: bool = False) -> int:
    """Distinct parameters (a tied head counts once); optionally without embeddings."""
    seen = {}
    for name, p in model.named_parameters():
        seen[id(p)] = (name, p.numel())
    total = sum(n for _, n in seen.values())
    if non_embedding:
        total -= sum(n for name, n in seen.values() if name.endswith(("wte.weight", "wpe.weight",
                                                                       "embed_tokens.weight")))
    return total


def save_model(model, out_dir: str | Path, *, tokenizer_dir: str | Path | None = None,
               extra: dict | None = None) -> None:
    """`save_pretrained` (safetensors) plus the shared tokenizer and an optional growlm.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    record_sha256(out_dir / "model.safetensors")
    if tokenizer_dir is not None:
        copy_tokenizer(tokenizer_dir, out_dir)
    if extra:
        (out_dir / "growlm.json").write_text(json.dumps(extra, indent=2, sort_keys=True))


def load_model(model_dir: str | Path):
    """Load a saved model with `AutoModelForCausalLM`, checked against the sha256 recorded when it
    was saved; a missing or damaged file is a one-line error naming it."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise GrowlmError(f"no model at {model_dir} (config.json missing)")
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        raise GrowlmError(f"model at {model_dir} has no model.safetensors")
    check_recorded_sha256(weights)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    except Exception as err:  # corrupt safetensors, mismatched config
        raise damaged(weights, f"the model does not load: {str(err).splitlines()[0][:200]}") from None
    return model


def enable_recompute(model: torch.nn.Module, every: int = 1) -> None:
    """Activation recomputation (non-reentrant checkpointing) on blocks 0, k, 2k, ... (k = `every`;
    1: all, 0: none): those blocks keep only their input and recompute the rest in the backward.

    HF GPT-2 and Llama blocks are `GradientCheckpointingLayer`s with a `gradient_checkpointing` flag
    each; enabling it on the model sets them all, after which the blocks not chosen are switched off."""
    core = getattr(model, "module", model)
    if every <= 0:
        return
    kwargs = {"use_reentrant": False}
    if hasattr(core, "activation_checkpointing_enable"):
        core.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        core.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    blocks = family_of(core).blocks(core)
    if every > 1:
        for i, block in enumerate(blocks):
            if hasattr(block, "gradient_checkpointing"):
                block.gradient_checkpointing = i % every == 0


class LogitEnsemble(torch.nn.Module):
    """The untrained control: the average of the members' logits (a product of experts)."""

    def __init__(self, members: list[torch.nn.Module]):
        super().__init__()
        self.members = torch.nn.ModuleList(members)
        self.config = members[0].config

    def forward(self, input_ids: torch.Tensor, **kwargs):
        logits = torch.stack([m(input_ids=input_ids).logits for m in self.members]).mean(0)
        return CausalLMOutput(logits=logits)
