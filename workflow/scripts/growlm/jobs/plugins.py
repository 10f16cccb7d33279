"""The check of `grow.plugins` before any training: every plugin operator grows tiny random members.

The Snakefile reads plugin files without running them (`growlm.plugins.describe`). Before the first
job of a run (Snakemake's `onstart`), this module imports them for real and runs each operator the
sweep uses on small random members of the experiment's shapes (d0, L0, n, head size; a 64-token
vocabulary and 16 positions), so that a plugin that cannot work stops the run before any compute is
spent, with one line naming the file and the problem:

* the import fails (an exception at import time, or no operator registered);
* the operator raises, or returns something that is not a GPT-2 (`config`, `logits`);
* the grown model has the wrong width or depth, or non-finite weights or logits;
* it is declared `exact=True` but its logits at step 0 differ (in float64) from m_1's (a
  single-source operator) or from the members' logit average (a multi-member operator);
* its model changes per step (`growth_step`) and a refinement through its ramp recompiles it under
  torch.compile (`growlm.compile_check`: a ramp read as a Python float in forward).

    python -m growlm.jobs.plugins CHECK.json      # what growlm.validate.check_plugin_operators runs (onstart)
"""

from __future__ import annotations

import json
import sys

import torch

from growlm.compile_check import check_compiles_once, train_briefly
from growlm.errors import GrowlmError
from growlm.growth import grow, load_plugins
from growlm.methods import OPERATORS, growth_names, method_chain
from growlm.refiners import REFINERS
from growlm.model import build_model
from growlm.shape import ModelShape

VOCAB, CONTEXT = 64, 16


def _members(n: int, d0: int, L0: int, model: dict) -> list[torch.nn.Module]:
    settings = {**model, "n_embd": d0, "n_layer": L0, "n_positions": CONTEXT, "vocab_size": VOCAB}
    return [build_model(seed=1000 + i, **settings).double() for i in range(n)]


def check_operator(name: str, source: str, method: list[str], *, n: int, d0: int, L0: int, d1: int, L1: int,
                   head_dim: int = 16, tied: bool = True, model: dict | None = None,
                   options: dict | None = None) -> None:
    """Grow random members (of the experiment's family: `model`, growlm.experiment.model_settings
    without the size) with `method` (a chain that contains plugin operator `name`) and check the
    result; GrowlmError naming `source` and the problem."""
    model = {"head_dim": head_dim, "tie_word_embeddings": tied, **(model or {})}
    members = _members(n, d0, L0, model)
    chain = growth_names(method)
    where = f"grow.plugins: {source}: operator {name!r} (in {'+'.join(chain)}, {n} members {d0}x{L0} -> {d1}x{L1})"
    try:
        grown = grow(members, chain if len(chain) > 1 else chain[0], n_embd=d1, n_layer=L1, seed=0, **(options or {}))
    except GrowlmError as err:
        raise GrowlmError(f"{where}: {err}") from None
    except Exception as err:  # the user's code
        raise GrowlmError(f"{where} raised {type(err).__name__}: {err}") from None
    config = getattr(grown, "config", None)
    if config is None or not callable(grown):
        raise GrowlmError(f"{where}: returned a {type(grown).__name__}, not a model of the members' family (a "
                          f"{type(members[0]).__name__} or a model with .config and .logits)")
    shape = ModelShape.of(config)
    if (shape.d, shape.L) != (d1, L1):
        raise GrowlmError(f"{where}: returned a model of width {shape.d} and depth {shape.L}, not {d1} and {L1}")
    bad = [p for p, t in grown.named_parameters() if not torch.isfinite(t).all()]
    if bad:
        raise GrowlmError(f"{where}: the grown model has non-finite values in {bad[0]}")
    if hasattr(grown, "growth_step"):
        grown.growth_step(0)
    x = torch.randint(0, VOCAB, (2, CONTEXT), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        grown = grown.double()
        logits = grown(input_ids=x).logits
        if tuple(logits.shape) != (2, CONTEXT, VOCAB):
            raise GrowlmError(f"{where}: logits of shape {tuple(logits.shape)}, not (batch, context, vocabulary) = "
                              f"(2, {CONTEXT}, {VOCAB})")
        if not torch.isfinite(logits).all():
            raise GrowlmError(f"{where}: the grown model's logits are not finite")
        if all(OPERATORS[nm].exact for nm in chain):
            used = members if any(OPERATORS[nm].multi for nm in chain) else members[:1]
            target = sum(m(input_ids=x).logits for m in used) / len(used)
            err = (logits - target).abs().max().item()
            # transformers computes RMSNorm in float32 even for float64 weights (Llama): 1e-7 rounding
            tol = 1e-8 if shape.norm == "layernorm" else 1e-5
            if err > tol * max(1.0, target.abs().max().item()):
                what = "m_1's" if len(used) == 1 else "the members' logit average"
                raise GrowlmError(f"{where}: declared exact=True, but at step 0 its logits differ from {what} by "
                                  f"{err:.3g} (float64); declare exact=False or fix the operator")
    if hasattr(grown, "growth_step"):  # its model changes per step: a refinement must not recompile it
        if hasattr(grown, "set_ramps"):
            grown.set_ramps(ramp_steps=3, ln_ramp_steps=3)
        check_compiles_once(grown.float(), where)


def check_refiner(name: str, source: str, method: list[str], *, n: int, d0: int, L0: int, d1: int, L1: int,
                  head_dim: int = 16, tied: bool = True, model: dict | None = None, options: dict | None = None) -> None:
    """Refine a model grown from random members by `method`'s growth operators for a few steps of the real
    training loop with plugin refinement operator `name` (its options, its step counts set to 2), so that
    an error in its code (a typo in `loss`) stops the run before the first job, naming `source`. A refiner
    that reads files the grow job writes (`inputs`) is imported only."""
    cls = REFINERS[name]
    where = f"grow.plugins: {source}: refinement operator {name!r} (in {'+'.join(method)})"
    if cls.inputs:
        return
    model = {"head_dim": head_dim, "tie_word_embeddings": tied, **(model or {})}
    chain = growth_names(method)
    grown = grow(_members(n, d0, L0, model), chain if len(chain) > 1 else chain[0], n_embd=d1, n_layer=L1, seed=0,
                 **{k: v for k, v in (options or {}).items() if any(k in OPERATORS[nm].options for nm in chain)})
    if hasattr(grown, "set_ramps"):
        grown.set_ramps(ramp_steps=2, ln_ramp_steps=2)
    spec = OPERATORS[name]
    settings = {**spec.options, **{k: v for k, v in (options or {}).items() if k in spec.options},
                **{k: 2 for k in spec.ramps}}
    try:
        train_briefly(grown.float(), 4, context=CONTEXT, refiners={name: settings})
    except GrowlmError as err:
        raise GrowlmError(f"{where}: {err}") from None
    except Exception as err:  # the user's code
        raise GrowlmError(f"{where} raised {type(err).__name__} in a 4-step refinement: {err}") from None


def check(spec: dict) -> list[str]:
    """Import spec["plugins"] and check every (method, shape) of spec["checks"]; the names checked."""
    load_plugins(spec["plugins"])
    done = []
    for c in spec["checks"]:
        shape = dict(n=c["n"], d0=c["d0"], L0=c["L0"], d1=c["d1"], L1=c["L1"], head_dim=c["head_dim"],
                     tied=c["tied"], model=c.get("model"), options=c.get("options"))
        for name in method_chain(c["method"]):
            if name not in OPERATORS or OPERATORS[name].source == "growlm":
                continue
            if OPERATORS[name].axis == "refine":
                check_refiner(name, OPERATORS[name].source, c["method"], **shape)
            else:
                check_operator(name, OPERATORS[name].source, c["method"], **shape)
            done.append(f"{'+'.join(c['method'])} ({c['n']} x {c['d0']}x{c['L0']} -> {c['d1']}x{c['L1']})")
    return done


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    try:
        done = check(spec)
    except GrowlmError as err:
        print(f"growlm: {err}", file=sys.stderr)
        return 2
    print(f"growlm: plugin operators checked: {'; '.join(dict.fromkeys(done)) or 'none used by the sweep'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
