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
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_outputs import CausalLMOutput

from growlm.errors import GrowlmError, check_recorded_sha256, damaged, record_sha256
from growlm.families import build, family_of
from growlm.family_specs import DEFAULT_FAMILY
from growlm.shape import ModelShape
from growlm.tokenizer import copy_tokenizer


HEAD_DIM = 16  # the head size of a model built in code without one (a workflow run always gives model.head_dim)


def build_model(seed: int = 0, *, family: str = DEFAULT_FAMILY, like: str | Path | None = None, **config_kwargs):
    """A freshly initialised model; the same seed gives the same weights. `config_kwargs` are
    `growlm.experiment.model_settings` (width, depth, head size, ...) and the vocabulary size.
    `like`: a model folder (a pretrained member) whose config, resized, the new model takes
    (its family, activation, norm epsilon, rotary base...). Every family builds its models the same way:
    its config (`growlm.families.Family.config`, growlm's defaults), initialised under `seed`."""
    if like is not None:
        template = AutoConfig.from_pretrained(like)
        shape = ModelShape.of(template)
        s = ModelShape.of({**config_kwargs, "family": shape.family})
        config = family_of(template).resized(template, n_embd=s.d, n_layer=s.L, n_head=s.d // shape.dh)
        return family_of(config).build(config, seed)
    if config_kwargs.get("n_head") is None and config_kwargs.get("head_dim") is None:
        config_kwargs["head_dim"] = HEAD_DIM
    head_dim = config_kwargs["head_dim"] if config_kwargs.get("n_head") is None else None
    if head_dim and config_kwargs.get("n_head") is None and config_kwargs["n_embd"] % head_dim:
        raise GrowlmError(f"width {config_kwargs['n_embd']} is not a multiple of the head size {head_dim}")
    return build(ModelShape.of({**config_kwargs, "family": family}), seed)


def n_params(model: torch.nn.Module, *, non_embedding: bool = False) -> int:
    """Distinct parameters (a tied head counts once); optionally without embeddings (the weights of its
    `nn.Embedding` modules: token and learned position tables, whatever the family calls them)."""
    seen = {}
    for name, p in model.named_parameters():
        seen[id(p)] = (name, p.numel())
    total = sum(n for _, n in seen.values())
    if non_embedding:
        tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        total -= sum(n for key, (_, n) in seen.items() if key in tables)
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
