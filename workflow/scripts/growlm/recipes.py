"""Each method as its authors run it, expressed as shares of the run so that it carries to any budget
(torch-free: the Snakefile resolves the grow and refine jobs' settings with it).

growlm refines every grown model with one common recipe (fresh AdamW, `train.refine.warmup_steps` of
warm-up to the large arms' peak rate, decay over the budget by the refinement's `train.schedule`). Where a method's paper prescribes
its own, it is applied here on top, and a user's settings override it (`grow.options.<operator>`, the
`vcycle` and `apollo` keys). What each paper prescribes, and what growlm chose where a paper says
nothing that carries to a small run, is listed in `RECIPES` (docs/methods.md shows it):
"""

from __future__ import annotations

import math
from fractions import Fraction

from growlm.methods import LEARNED_MIN_STEPS, LEARNED_SHARE, OPERATORS, SCHEDULE, method_chain

# LEMON's refinement: the same peak rate, its cosine reaching the floor after this share of the budget
LEMON_DECAY_SHARE = Fraction(2, 3)
# the V-cycle's own stages (its grow job) decay as its authors' do, by a cosine from their start, whatever the large
# arms' `train.schedule`: its first stage is all warm-up, which no decay at the end could follow. The refinement
# after it (its last stage, at the peak rate without re-warm-up) takes the refinement's schedule, as Apollo's does
VCYCLE_STAGE_SCHEDULE = "cosine"

RECIPES = {
    "vcycle": "the authors' GPT-2 V-cycle: the large model trained briefly (all warm-up), coalesced (layer i "
              "with i + L/2, head h with h + H/2), the coarse model trained at 4x the rate with a fresh "
              "optimizer, de-coalesced and interpolated (alpha 0.5) with the weights from before coalescing; "
              "then the large model trains `vcycle.final_share` (half) of the budget at the peak rate, no "
              "re-warm-up. Stage lengths are shares of the budget (`vcycle.*`); the stages decay by a cosine "
              "whatever `train.schedule` says, the last stage (the refinement) follows it",
    "apollo": "the authors' GPT-2 script: shared layers and sampled depth for the first quarter of the run "
              "(`apollo.share`), stages of 1, 2, 4.. unique blocks as long as their block counts say, "
              "at the run's rate with 2.5% of it as warm-up; then the full model for the rest "
              "(`apollo.final_share`) at the peak rate, no re-warm-up",
    "lemon": f"the paper: the same peak rate, a faster decay - growlm's cosine reaches its floor after "
             f"{LEMON_DECAY_SHARE} of the refinement (the paper gives no share; growlm's choice: the scratch "
             f"run's length less the saving the paper reports for BERT, a third; `train.refine.decay_share` "
             f"sets another); under `train.schedule: wsd` the whole schedule, its decay included, ends there",
    "hyperclone": "the paper's symmetry-breaking noise: cancelling +N/-N pairs at 10 dB signal-to-noise "
                  "(`noise: 0.316` of each matrix's std, the operator's default)",
    "ligo": f"trained {LEARNED_SHARE} of the shortest refinement's steps (at least {LEARNED_MIN_STEPS}): the "
            f"paper's 100 steps are about 0.03% of its BERT run, under one step here; growlm's choice keeps "
            f"their cost at 5% of M_0's",
    "mango": f"as ligo: {LEARNED_SHARE} of the shortest refinement's steps (at least {LEARNED_MIN_STEPS})",
    "stack": "G_stack's growth timing (how long the small model trains) as `train.small.tokens: gstack`, "
             "where its fitted formula applies (models of 410M parameters and up); growlm's common recipe "
             "otherwise (fresh AdamW with a re-warm-up, as the paper's)",
}


# G_stack's growth-timing formula (Du et al., NeurIPS 2024, the prts README), fitted on their runs of
# these target sizes: log10 d = 0.88 log10 N + 163.27 / log10 C - 5.74 (d: the small model's tokens, N: the
# target's parameters, C: the target's compute budget in FLOPs)
GSTACK_FITTED = (4.1e8, 7.0e9)


def gstack_tokens(n_params: int, budget_tokens: int) -> int:
    """The small model's tokens by G_stack's growth-timing formula, for a target of `n_params`
    parameters trained on `budget_tokens` (C = 6 N D)."""
    c = 6.0 * n_params * budget_tokens
    return int(round(10 ** (0.88 * math.log10(n_params) + 163.27 / math.log10(c) - 5.74)))


def gstack_problem(n_params: int, budget_tokens: int) -> str | None:
    """Why the formula does not apply to this target (None: it does)."""
    lo, hi = GSTACK_FITTED
    d = gstack_tokens(n_params, budget_tokens)
    if not lo / 2 <= n_params <= hi * 2:
        return (f"train.small.tokens = gstack: G_stack's growth-timing formula was fitted on targets of "
                f"{lo:.2g}-{hi:.2g} parameters; M_0 here has {n_params:.3g}, for which it gives {d:.3g} tokens "
                f"(M_0's budget: {budget_tokens:.3g}); give train.small.tokens as a number")
    if d >= budget_tokens:
        return (f"train.small.tokens = gstack: the formula gives {d:.3g} tokens for the small model, not less than "
                f"M_0's budget of {budget_tokens:.3g}; give train.small.tokens as a number")
    return None


def learned_steps(refine_steps: int) -> int:
    """A learned operator's training steps unless configured: `LEARNED_SHARE` of the shortest refinement."""
    return max(LEARNED_MIN_STEPS, int(refine_steps * LEARNED_SHARE))


def grow_recipe(config: dict, chain: list[str], options: dict, *, refine_steps: int) -> dict:
    """The grow job's operator options with the authors' recipes where the config sets nothing: the
    learned operators' steps as a share of the refinement."""
    out = dict(options)
    configured = {k for name in chain for k in (config["grow"]["options"].get(name) or {})}
    if any(OPERATORS[name].learned for name in chain if name in OPERATORS) and "steps" not in configured:
        out["steps"] = learned_steps(refine_steps)
    return out


def refine_recipe(config: dict, method: str, settings: dict) -> dict:
    """The refinement's `settings` (TrainConfig.run_settings) with `method`'s recipe applied."""
    out = dict(settings)
    chain = method_chain(method)
    spec = OPERATORS.get(method)
    if spec is not None and spec.axis == SCHEDULE and "final_share" in spec.options:
        # the schedule's last stage: a share of the budget (its config section's), no re-warm-up by default
        # the schedule's options: its description's defaults under its config section (a schedule that
        # has no config section, as one registered by a test, runs on its description's alone)
        opts = {**spec.options, **(config.get(method) or {})}
        share = float(opts["final_share"])
        out["tokens"] = max(1, int(round(share * int(settings["tokens"]))))
        steps = out["tokens"] // (int(settings["batch_size"]) * int(settings["context"]))
        out["warmup_steps"] = int(round(float(opts.get("final_warmup", 0)) * steps))
    if "lemon" in chain and "decay_share" not in (config["train"].get("refine") or {}):
        out["decay_share"] = float(LEMON_DECAY_SHARE)
    return out


def recipe_table() -> str:
    """The markdown table of `RECIPES` (docs/methods.md holds it; tests/test_docs.py checks it)."""
    rows = ["| method | its authors' recipe, as growlm runs it |", "|---|---|"]
    rows += [f"| `{name}` | {text.replace('|', chr(92) + '|')} |" for name, text in RECIPES.items()]
    return "\n".join(rows) + "\n"
