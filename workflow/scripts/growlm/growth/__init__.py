"""growlm.growth: grow n small trained GPT-2 members into the initial weights of a larger GPT-2.

    grow(members, method, *, n_embd, n_layer, n_head=None, seed=0, **options) -> model
    METHODS                   sorted names of the registered operators
    save_grown(model, dir) / load_grown(dir)

`method` is an operator name or a chain (list) of names, e.g. ["hyperclone", "zero_block"]. A chain
runs its width operators first, then its depth operators: the width operator goes to `n_embd`
keeping the depth, the depth operator then to `n_layer`. A combining operator followed by another
operator of the same axis stops at its natural size (`concat` at n*d0, `stack_members` at n*L0).
["concat", "lemon"] is fused: concat pads each member group LEMON-style to reach any width >= n*d0.
A single-source operator before a combining one is applied to every member separately.

Options are keyword arguments; each operator receives those it declares (see `options_of`), so a
chain takes the union; an option no operator of the chain declares is an error.

Returned models are plain `GPT2LMHeadModel`s, except operators with growth masks (`msg`, `concat`
with n > 1): these return a `GrownGPT2` whose forward(input_ids) gives `.logits`, whose
`growth_step(step)` the training loop calls before every step (sets the ramps), with a `ramp_done`
property and `to_gpt2()` (a plain GPT2LMHeadModel once the ramps are complete).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from transformers import GPT2LMHeadModel

from growlm.errors import GrowlmError
from growlm.growth.common import INFO, Shape
from growlm.growth.registry import OPERATORS
from growlm.methods import members_used  # noqa: F401 (the torch-free table's answer)

# operators register themselves on import
from growlm.growth import clone, depth  # noqa: E402,F401
from growlm.growth import lemon, net2net  # noqa: E402,F401
from growlm.growth import concat, msg  # noqa: E402,F401
from growlm.growth import learned  # noqa: E402,F401
from growlm.growth import multilevel  # noqa: E402,F401
from growlm.growth.masked import GrownGPT2  # noqa: E402

METHODS: list[str] = sorted(OPERATORS)
_AXIS_ORDER = {"width": 0, "both": 1, "depth": 2}
GROWN_JSON = "growlm_grown.json"
GROWN_TENSORS = "growlm_grown.safetensors"

__all__ = ["grow", "METHODS", "save_grown", "load_grown", "options_of", "members_used", "GrownGPT2", "plan"]


def options_of(name: str) -> dict:
    """The options operator `name` takes, with their defaults."""
    return dict(INFO[name].options)


def _check_members(members) -> Shape:
    if isinstance(members, torch.nn.Module):
        members = [members]
    if not members:
        raise GrowlmError("grow() needs at least one member model")
    shapes = []
    for i, m in enumerate(members):
        if not isinstance(m, GPT2LMHeadModel):
            raise GrowlmError(f"member {i + 1} is a {type(m).__name__}, not a GPT2LMHeadModel")
        shapes.append(Shape.of(m))
    ref, c0 = shapes[0], members[0].config
    names = {"d": "width (n_embd)", "L": "depth (n_layer)", "h": "head count (n_head)", "f": "MLP width (n_inner)",
             "V": "vocabulary size", "T": "context (n_positions)", "tied": "tie_word_embeddings"}
    for i, (s, m) in enumerate(zip(shapes[1:], members[1:]), start=2):
        for k, what in names.items():
            if getattr(s, k) != getattr(ref, k):
                raise GrowlmError(f"members differ in {what}: member 1 has {getattr(ref, k)}, "
                                  f"member {i} has {getattr(s, k)}")
        for attr in ("activation_function", "layer_norm_epsilon"):
            if getattr(m.config, attr) != getattr(c0, attr):
                raise GrowlmError(f"members differ in {attr}: {getattr(c0, attr)} vs {getattr(m.config, attr)}")
    return ref


def _chain(method) -> list[str]:
    names = [method] if isinstance(method, str) else list(method)
    if not names:
        raise GrowlmError("empty growth method chain")
    for name in names:
        if not isinstance(name, str) or name not in OPERATORS:
            raise GrowlmError(f"unknown growth method {name!r}; known: {', '.join(sorted(OPERATORS))}")
    if len(set(names)) != len(names):
        raise GrowlmError(f"growth chain {names} repeats an operator")
    return names


def plan(members_shape: Shape, n: int, method, *, n_embd: int, n_layer: int, n_head: int | None = None):
    """The steps of a chain: [(names, n_embd, n_layer)], validated; raises GrowlmError."""
    s = members_shape
    names = _chain(method)
    if n_embd < s.d:
        raise GrowlmError(f"target width n_embd={n_embd} is smaller than the members' width {s.d}")
    if n_layer < s.L:
        raise GrowlmError(f"target depth n_layer={n_layer} is smaller than the members' depth {s.L}")
    if n_head is not None and (n_head <= 0 or n_embd % n_head):
        raise GrowlmError(f"n_head={n_head} does not divide the target width {n_embd}")
    names = sorted(names, key=lambda nm: _AXIS_ORDER[INFO[nm].axis])
    steps, i = [], 0
    cur, cur_n = s, n
    while i < len(names):
        name = names[i]
        info = INFO[name]
        fused = [name]
        if i + 1 < len(names) and names[i + 1] in info.absorbs:
            fused.append(names[i + 1])
            i += 1
        later = names[i + 1:]
        later_w = any(INFO[o].axis in ("width", "both") for o in later)
        later_d = any(INFO[o].axis in ("depth", "both") for o in later)
        natural = info.natural(cur, cur_n) if info.natural and len(fused) == 1 else None
        if info.axis == "width":
            if later_w and natural is None:
                raise GrowlmError(f"chain {names}: two width operators ({name} then "
                                  f"{[o for o in later if INFO[o].axis != 'depth'][0]}) and {name} has no natural "
                                  f"intermediate width")
            tw, tl = (natural[0] if later_w else n_embd), cur.L
        elif info.axis == "depth":
            if later_d and natural is None:
                raise GrowlmError(f"chain {names}: two depth operators and {name} has no natural intermediate depth")
            tw, tl = cur.d, (natural[1] if later_d else n_layer)
        else:
            if later_w:
                raise GrowlmError(f"chain {names}: {name} grows width and depth, so it must come after the "
                                  f"width operators")
            tw, tl = n_embd, (cur.L if later_d else n_layer)
        hd = n_head if (tw == n_embd) else None
        try:
            if info.check is not None:
                info.check(cur, cur_n, tw, tl, hd, **({"absorbed": tuple(fused[1:])} if len(fused) > 1 else {}))
        except GrowlmError as err:
            raise GrowlmError(f"{'+'.join(fused)}: {err}") from None
        steps.append((fused, tw, tl, hd))
        h = hd if hd is not None else (tw // cur.dh if tw % cur.dh == 0 else cur.h)
        cur = replace(cur, d=tw, L=tl, h=h, dh=tw // h, f=cur.f * tw // cur.d)
        if OPERATORS[name].multi:
            cur_n = 1
        i += 1
    if (cur.d, cur.L) != (n_embd, n_layer):
        what = []
        if cur.L != n_layer:
            what.append(f"depth {cur.L} instead of {n_layer} (add a depth operator, e.g. "
                        f"{names + ['zero_block']})")
        if cur.d != n_embd:
            what.append(f"width {cur.d} instead of {n_embd} (add a width operator, e.g. "
                        f"{['hyperclone'] + names})")
        raise GrowlmError(f"growth method {names if len(names) > 1 else names[0]!r} reaches "
                          + " and ".join(what))
    return steps


def grow(members, method, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0, **options):
    """Grow `members` (GPT2LMHeadModels of one shape) into a model of width n_embd and depth n_layer."""
    if isinstance(members, torch.nn.Module):
        members = [members]
    members = list(members)
    shape = _check_members(members)
    steps = plan(shape, len(members), method, n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    names = [nm for fused, *_ in steps for nm in fused]
    accepted = {k for nm in names for k in INFO[nm].options}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise GrowlmError(f"option(s) {', '.join(unknown)} not taken by {'+'.join(names)}; they take: "
                          + "; ".join(f"{nm}: {', '.join(INFO[nm].options) or '-'}" for nm in names))
    cur = members
    with torch.no_grad():
        for i, (fused, tw, tl, hd) in enumerate(steps):
            name = fused[0]
            op = OPERATORS[name]
            opts = {k: v for k, v in options.items() if any(k in INFO[nm].options for nm in fused)}
            if len(fused) > 1:
                opts["absorbed"] = fused[1:]
            later_multi = any(OPERATORS[nm].multi for f2, *_ in steps[i + 1:] for nm in f2)
            if op.multi:
                cur = [op.fn(cur, n_embd=tw, n_layer=tl, n_head=hd, seed=seed, **opts)]
            elif later_multi:
                cur = [op.fn([m], n_embd=tw, n_layer=tl, n_head=hd, seed=seed + j, **opts)
                       for j, m in enumerate(cur)]
            else:
                cur = [op.fn(cur[:1], n_embd=tw, n_layer=tl, n_head=hd, seed=seed, **opts)]
    model = cur[0]
    flops = sum(int(getattr(m, "growlm_growth_flops", 0)) for m in cur)
    model.growlm_growth_flops = flops
    model.eval()
    return model


# ----------------------------------------------------------------------------------------------
# saving and loading grown models
# ----------------------------------------------------------------------------------------------

def save_grown(model, out_dir) -> None:
    """Save a grown model: `save_pretrained` for a plain GPT2LMHeadModel; for a `GrownGPT2`,
    `growlm_grown.json` (class, config, spec, ramp step) + `growlm_grown.safetensors` (all
    tensors, tied ones once). No pickle. The directory of a GrownGPT2 has no config.json, so
    `AutoModelForCausalLM` does not load it by mistake (its step-0 function needs the masks)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(model, GPT2LMHeadModel):
        model.save_pretrained(out_dir, safe_serialization=True)
        (out_dir / GROWN_JSON).unlink(missing_ok=True)
        return
    if isinstance(model, GrownGPT2):
        for stale in ("config.json", "model.safetensors"):
            (out_dir / stale).unlink(missing_ok=True)
        meta, tensors = model.export()
        from safetensors.torch import save_file

        save_file(tensors, str(out_dir / GROWN_TENSORS))
        (out_dir / GROWN_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True))
        return
    raise GrowlmError(f"cannot save a grown model of type {type(model).__name__}")


def load_grown(out_dir):
    """Load what `save_grown` wrote (a GPT2LMHeadModel or a GrownGPT2)."""
    out_dir = Path(out_dir)
    if (out_dir / GROWN_JSON).is_file():
        meta = json.loads((out_dir / GROWN_JSON).read_text())
        if meta.get("class") != "GrownGPT2":
            raise GrowlmError(f"{out_dir / GROWN_JSON}: unknown grown-model class {meta.get('class')!r}")
        if not (out_dir / GROWN_TENSORS).is_file():
            raise GrowlmError(f"grown model at {out_dir} has no {GROWN_TENSORS}")
        from safetensors.torch import load_file

        return GrownGPT2.restore(meta, load_file(str(out_dir / GROWN_TENSORS)))
    from growlm.model import load_model

    return load_model(out_dir)
