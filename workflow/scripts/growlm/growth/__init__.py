"""growlm.growth: grow n small trained members (GPT-2 or Llama) into the initial weights of a larger model.

    grow(members, method, *, n_embd, n_layer, n_head=None, seed=0, **options) -> model
    save_grown(model, dir) / load_grown(dir)
    options_of(name)          the options an operator takes, with their defaults
    register_operator(...)    describe and implement your own operator (see docs/methods.md's tutorial)
    load_plugins(paths)       import the plugin files of grow.plugins (their operators register)

What each operator is (axis, exactness, options, constraints) is described in `growlm.methods`;
the implementations are in this package, one module per kind of operator (each works on the
family-neutral weight form of `growlm.families`, so on GPT-2 and Llama models alike):

    clone     hyperclone
    lemon     lemon
    net2net   net2net, fpi, aki
    depth     zero_block, stack, interleave, stack_members
    msg       msg
    concat    concat
    members   msg_members, merge (weight matching, averaging)
    learned   ligo, mango
    masked    GrownModel, the model with growth masks and grouped norms (msg, msg_members, concat)
    algebra   the weight form's tools, target configs, the depth plans
    width     the width engine (WidthPlan, WidthEngine, tile plans, key/value head placement)
    registry  the implementations by name; `implements`, `register_operator`
    chain     grow(), save_grown, load_grown
    moments   optimizer-state carry-over (the linear part of an operator, applied to AdamW moments)
"""

from __future__ import annotations

# every operator module registers its implementations on import
from growlm.growth import clone, concat, depth, learned, lemon, members, msg, net2net  # noqa: F401
from growlm.growth.chain import grow, load_grown, options_of, save_grown
from growlm.growth.masked import GrownGPT2, GrownModel
from growlm.growth.registry import load_plugins, register_operator

__all__ = ["grow", "save_grown", "load_grown", "options_of", "register_operator", "load_plugins", "GrownModel",
           "GrownGPT2"]
