"""`grow()`: n trained members -> the initial weights of M'_1, through an operator or a chain.

`method` is an operator name or a chain (list) of names, e.g. ["hyperclone", "zero_block"].
`growlm.methods.plan_chain` orders and checks the chain (width operators first, then depth; each
operator's own constraints); this module runs it with the registered implementations. A
combining operator followed by another operator of the same axis stops at its natural size
(`concat` at n*d0, `stack_members` at n*L0); ["concat", "lemon"] is fused (concat pads each member
group LEMON-style to reach any width >= n*d0). A single-source operator before a combining one is
applied to every member separately.

Options are keyword arguments; each operator receives those its description declares, so a chain
takes the union, and an option no operator of the chain declares is an error.

Members are models of one family (`growlm.families`: GPT-2 or Llama) and one shape. Returned models
are plain models of that family, except operators with growth masks (`msg`, `msg_members`, `concat`
with n > 1): these return a `GrownModel` whose forward(input_ids) gives `.logits`, whose
`growth_step(step)` the training loop calls before every step (sets the ramps), with a `ramp_done`
property and `to_plain()` (a plain model once the ramps are complete). `save_grown` and
`load_grown` store either kind without pickle.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from growlm.errors import GrowlmError, check_recorded_sha256, damaged, read_json, record_sha256
from growlm.families import FAMILY, family_of
from growlm.growth.masked import GrownModel
from growlm.growth.registry import IMPLEMENTATIONS
from growlm.methods import OPERATORS, check_options, plan_chain
from growlm.model import load_model, save_model
from growlm.pretrained import setting_differences
from growlm.shape import ModelShape

GROWN_JSON = "growlm_grown.json"
GROWN_TENSORS = "growlm_grown.safetensors"


def options_of(name: str) -> dict:
    """The options operator `name` takes, with their defaults."""
    return dict(OPERATORS[name].options)


def member_shape(members) -> ModelShape:
    """The one shape of the members; GrowlmError naming the first difference."""
    if isinstance(members, torch.nn.Module):
        members = [members]
    if not members:
        raise GrowlmError("grow() needs at least one member model")
    shapes = []
    for i, m in enumerate(members):
        if not isinstance(m, tuple(f.model_class for f in FAMILY.values())):
            raise GrowlmError(f"member {i + 1} is a {type(m).__name__}, not a model of a family growlm grows "
                              f"({', '.join(f.model_class.__name__ for f in FAMILY.values())})")
        shapes.append(ModelShape.of(m))
    ref, c0 = shapes[0], members[0].config
    names = {"family": "family", "d": "width (n_embd)", "L": "depth (n_layer)", "h": "head count (n_head)",
             "g": "key/value head count", "f": "MLP width (n_inner)", "V": "vocabulary size",
             "T": "context (n_positions)", "tied": "tie_word_embeddings", "attention_bias": "attention_bias"}
    for i, (s, m) in enumerate(zip(shapes[1:], members[1:]), start=2):
        for k, what in names.items():
            if getattr(s, k) != getattr(ref, k):
                raise GrowlmError(f"members differ in {what}: member 1 has {getattr(ref, k)}, "
                                  f"member {i} has {getattr(s, k)}")
        # every other setting that changes what a member computes (activation, norm epsilon, rotary
        # settings...): the grown model is built from member 1's config, so it must be every member's
        for what, a, b in setting_differences(c0.to_dict(), m.config.to_dict()):
            raise GrowlmError(f"members differ in {'their rotary settings' if what == 'rope' else what}: member 1 "
                              f"has {a}, member {i} has {b}")
    return ref


def check_step(model, name: str, chain: list[str], *, width: int, depth: int) -> None:
    """What operator `name` returned is a model of the width and depth its step of `chain` asked for: an
    operator (a plugin's) that returns another is named here, not the operator after it, which would
    stop on a shape it was never meant to see."""
    config = getattr(model, "config", None)
    if config is None or not callable(model):
        raise GrowlmError(f"{name} returned a {type(model).__name__}, not a model of the members' family")
    shape = ModelShape.of(config)
    if (shape.d, shape.L) != (width, depth):
        step = f" (what its step of {'+'.join(chain)} asks for)" if len(chain) > 1 else ""
        raise GrowlmError(f"{name} returned a model of width {shape.d} and depth {shape.L}, not {width} and {depth}{step}")


def grow(members, method, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0, **options):
    """Grow `members` (models of one family and shape) into a model of width n_embd and depth n_layer."""
    if isinstance(members, torch.nn.Module):
        members = [members]
    members = list(members)
    shape = member_shape(members)
    steps = plan_chain(shape, len(members), method, n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    names = [nm for fused, *_ in steps for nm in fused]
    check_options(names, options)
    cur = members
    with torch.no_grad():
        for i, (fused, tw, tl, hd) in enumerate(steps):
            name = fused[0]
            fn, multi = IMPLEMENTATIONS[name], OPERATORS[name].multi
            opts = {k: v for k, v in options.items() if any(k in OPERATORS[nm].options for nm in fused)}
            if len(fused) > 1:
                opts["absorbed"] = fused[1:]
            later_multi = any(OPERATORS[nm].multi for f2, *_ in steps[i + 1:] for nm in f2)
            if multi:
                cur = [fn(cur, n_embd=tw, n_layer=tl, n_head=hd, seed=seed, **opts)]
            elif later_multi:
                cur = [fn([m], n_embd=tw, n_layer=tl, n_head=hd, seed=seed + j, **opts) for j, m in enumerate(cur)]
            else:
                cur = [fn(cur[:1], n_embd=tw, n_layer=tl, n_head=hd, seed=seed, **opts)]
            for m in cur:
                check_step(m, "+".join(fused), names, width=tw, depth=tl)
    model = cur[0]
    flops = sum(int(getattr(m, "growlm_growth_flops", 0)) for m in cur)
    model.growlm_growth_flops = flops
    model.eval()
    return model


# ----------------------------------------------------------------------------------------------
# saving and loading grown models
# ----------------------------------------------------------------------------------------------

def save_grown(model, out_dir, *, tokenizer_dir=None) -> None:
    """Save a grown model as a transformers folder (config.json, model.safetensors and, given
    `tokenizer_dir`, the tokenizer: `AutoModelForCausalLM` and `AutoTokenizer` load it). For a
    `GrownModel` that folder holds its inner model - the model M'_1 becomes once its ramps are done - and
    `growlm_grown.json` (class, family, config, spec, ramp step) with `growlm_grown.safetensors` (the
    growth masks and member groups) hold what makes its function at a ramp step: `load_grown` reads
    both. No pickle."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(model, PreTrainedModel):
        family_of(model)  # one growlm grows
        save_model(model, out_dir, tokenizer_dir=tokenizer_dir)
        for stale in (GROWN_JSON, GROWN_TENSORS, GROWN_TENSORS + ".sha256"):
            (out_dir / stale).unlink(missing_ok=True)
        return
    if isinstance(model, GrownModel):
        meta, tensors = model.export()
        save_model(model.inner, out_dir, tokenizer_dir=tokenizer_dir)
        save_file({k: v for k, v in tensors.items() if k.startswith("growlm.")}, str(out_dir / GROWN_TENSORS))
        record_sha256(out_dir / GROWN_TENSORS)
        (out_dir / GROWN_JSON).write_text(json.dumps({**meta, "inner": "model.safetensors"}, indent=2, sort_keys=True))
        return
    raise GrowlmError(f"cannot save a grown model of type {type(model).__name__}")


def load_grown(out_dir):
    """Load what `save_grown` wrote (a plain model or a GrownModel; a GrownModel saved before its inner
    model was a transformers folder keeps every tensor in growlm_grown.safetensors)."""
    out_dir = Path(out_dir)
    if (out_dir / GROWN_JSON).is_file():
        meta = read_json(out_dir / GROWN_JSON)
        if meta.get("class") not in ("GrownModel", "GrownGPT2"):  # GrownGPT2: written before the Llama family
            raise damaged(out_dir / GROWN_JSON, f"unknown grown-model class {meta.get('class')!r}")
        tensors = out_dir / GROWN_TENSORS
        if not tensors.is_file():
            raise GrowlmError(f"grown model at {out_dir} has no {GROWN_TENSORS}")
        check_recorded_sha256(tensors)
        try:
            loaded = load_file(str(tensors))
        except Exception as err:  # a truncated file
            raise damaged(tensors, f"the grown model does not load: {str(err).splitlines()[0][:200]}") from None
        if meta.get("inner"):  # the inner model is the folder's transformers model
            inner = load_model(out_dir)
            loaded.update({"inner." + k: v for k, v in inner.state_dict().items()})
        try:
            return GrownModel.restore(meta, loaded)
        except Exception as err:  # tensors that do not fit the description
            raise damaged(tensors, f"the grown model does not load: {str(err).splitlines()[0][:200]}") from None
    return load_model(out_dir)
