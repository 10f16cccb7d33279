"""Section 9 of bench/RESULTS.md, every published method as its authors run it: the papers' figures
(`bench/published.csv`), the reproduction table at 200k and 800k tokens, the V-cycle's and Apollo's changes
one at a time (9a, 9b) and what limits each method at 800k (9c)."""

from __future__ import annotations

from rendering.core import RESULTS_PAGE, arm, block, f3, missing, pm, reached, row_of, sentence, table


@block("published", RESULTS_PAGE, "bench/published.csv")
def published(df) -> str:
    rows = [[", ".join(m if m.startswith("(") else f"`{m}`" for m in r["method"].split(", ")), f"{r['authors']} ({r['year']}), {r['title']}",
             f"[arXiv {r['arxiv']}](https://arxiv.org/abs/{r['arxiv']})", r["where"], r["figure"],
             r["small_model_counted"]] for _, r in df.iterrows()]
    return table(["growlm's name", "paper", "arXiv", "where the figure stands", "the reported figure (its setting)",
                  "the small model's training counted?"], rows)


RECIPE_ARMS = (("msg", "msg"), ("hyperclone+zero_block", "hyperclone+zero_block"), ("lemon", "lemon"),
               ("ligo", "ligo"), ("mango", "mango"), ("apollo", "apollo"), ("vcycle", "vcycle"))


def _short(r, members=True) -> str:
    """reached, cost ratio (free), final loss: one cell."""
    if missing(r["cost_ratio_mean"]):
        return f"{reached(r)}, -, {r['m1_final_val_loss']:.3f}"
    free = "" if not members else f" (free {r['cost_ratio_small_free_mean']:.3f})"
    return f"{reached(r)}, {pm(r['cost_ratio_mean'], r['cost_ratio_std'], one='')}{free}, {r['m1_final_val_loss']:.3f}"


@block("recipes", RESULTS_PAGE, "savings_methods_summary.csv", "recipes_summary.csv")
def recipes(common, authors) -> str:
    rows = []
    for method, _ in RECIPE_ARMS:
        c = row_of(common, method=method)
        a = row_of(authors, method=method) if (authors["method"] == method).any() else None
        rows.append([arm(method), _short(c), "the same (growlm's common recipe is msg's, with its mask ramp)"
                     if a is None else _short(a)])
    for method in ("fpi", "aki", "net2net+zero_block", "hyperclone+stack"):
        rows.append([arm(method), _short(row_of(common, method=method)), "no recipe beyond the common one"])
    m0 = authors["m0_final_val_loss"].iloc[0]
    return table(["method", "common recipe (1b): reached, cost ratio, members counted (free), final loss",
                  f"the authors' recipe (M_0 {m0:.3f}): reached, cost ratio (free), final loss"], rows)


@block("recipes-4x", RESULTS_PAGE, "recipes_4x_summary.csv", "recipes_4x_common_summary.csv")
def recipes_4x(authors, common) -> str:
    rows = []
    for method in ("msg", "hyperclone+zero_block", "lemon", "ligo", "mango", "apollo", "vcycle"):
        a = row_of(authors, method=method)
        c = row_of(common, method=method) if (common["method"] == method).any() else None
        rows.append([arm(method), _short(a), "the same" if c is None else _short(c)])
    m0 = authors["m0_final_val_loss"].iloc[0]
    return table(["method", f"the authors' recipe (M_0 {m0:.3f}): reached, cost ratio (free), final loss",
                  "growlm's common recipe"], rows)


VCYCLE_ROWS = (
    ("the authors' recipe (growlm's default: stage 1 for 5 % of M_0's steps, stride pairing, coarse model half the "
     "steps at 4x the rate, alpha 0.5, final stage half the steps, no re-warm-up)", "recipes_summary.csv"),
    ("re-warm-up in the final stage (`final_warmup: 0.1`)", "explore_vcycle_final_warmup.csv"),
    ("coarse model at the large model's rate (`lr_multiplier: 1`)", "explore_vcycle_lr_mult1.csv"),
    ("no interpolation with the stage-1 weights (`alpha: 1.0`)", "explore_vcycle_alpha1.csv"),
    ("neighbouring layers and heads merged (`pairing: adjacent`)", "explore_vcycle_adjacent.csv"),
    ("final stage three quarters of the steps (`final_share: 0.75`)", "explore_vcycle_final_long.csv"),
    ("no stage 1: M_0's random initialisation coalesced (`stage_share: 0`)", "explore_vcycle_no_stage1.csv"),
    ("coarse model a quarter of the steps, not half (`coarse_share: 0.25`)", "explore_vcycle_coarse_short.csv"),
    ("the authors' code's embedding scaling (`embeddings: sum`)", "explore_vcycle_embeddings_sum.csv"),
    ("growlm's earlier variant (random initialisation coalesced, fixed tokens; section 1b)",
     "savings_methods_summary.csv"),
)


def _one_change(spec, method, frames) -> str:
    rows = []
    for (label, _), df in zip(spec, frames):
        r = row_of(df, method=method)
        rows.append([label, reached(r), f"{r['m1_final_val_loss']:.3f}"])
    return table(["change", "reached", "final loss (mean of 3 seeds)"], rows)


@block("vcycle", RESULTS_PAGE, *(s for _, s in VCYCLE_ROWS))
def vcycle(*frames) -> str:
    return _one_change(VCYCLE_ROWS, "vcycle", frames)


APOLLO_ROWS = (
    ("the authors' recipe (growlm's default: a quarter of the budget with shared layers and sampled depth in the "
     "authors' stages, 2.5 % of M_0's steps of warm-up, then the full model for the other three quarters at the "
     "peak rate, no re-warm-up)", "explore_apollo_authors.csv"),
    ("every stage up to full depth, equal lengths (`stages: equal`)", "explore_apollo_stages_equal.csv"),
    ("10 warm-up steps in the progressive stage (`warmup_steps: 10`)", "explore_apollo_warmup10.csv"),
    ("the full model trains for the whole budget after the progressive stage (`final_share: 1.0`)",
     "explore_apollo_final_full.csv"),
    ("the full model warms up again over 5 % of its stage (`final_warmup: 0.05`)", "explore_apollo_final_warmup.csv"),
    ("growlm's first variant (all four; section 1b)", "savings_methods_summary.csv"),
)


@block("apollo", RESULTS_PAGE, *(s for _, s in APOLLO_ROWS))
def apollo(*frames) -> str:
    return _one_change(APOLLO_ROWS, "apollo", frames)


LIMIT_ROWS = (  # (label, file, method)
    ("`hyperclone` + `zero_block`, common recipe (plain copies)", "explore_recipes_4x_a.csv", "hyperclone+zero_block"),
    ("... with the member's AdamW moments carried (`carry`)", "explore_recipes_4x_a.csv",
     "hyperclone+zero_block+carry"),
    ("`lemon`, common recipe", "explore_recipes_4x_a.csv", "lemon"),
    ("... with `carry`, as growlm carried moments before this run", "explore_recipes_4x_a_unbounded.csv",
     "lemon+carry"),
    ("... with `carry`, the second moment bounded (growlm now)", "explore_recipes_4x_a.csv", "lemon+carry"),
    ("`fpi` (bert2BERT), common recipe", "explore_recipes_4x_c.csv", "fpi"),
    ("`aki` (bert2BERT), common recipe", "explore_recipes_4x_c.csv", "aki"),
    ("`net2net` + `zero_block`, common recipe", "explore_recipes_4x_c.csv", "net2net+zero_block"),
    ("`hyperclone` + `stack` (G_stack's arm), common recipe", "explore_recipes_4x_c.csv", "hyperclone+stack"),
    ("`vcycle`, the authors' recipe (9)", "recipes_4x_summary.csv", "vcycle"),
    ("... no stage 1 (`stage_share: 0`)", "explore_recipes_4x_a.csv", "vcycle"),
    ("... final stage three quarters of the budget (`final_share: 0.75`)", "explore_recipes_4x_b.csv", "vcycle"),
    ("growlm's earlier V-cycle (9, common recipe)", "recipes_4x_common_summary.csv", "vcycle"),
    ("`apollo`, the authors' recipe (9)", "recipes_4x_summary.csv", "apollo"),
    ("... the full model for the whole budget (`final_share: 1.0`)", "explore_recipes_4x_a.csv", "apollo"),
    ("... the full model re-warmed up over 5 % of its stage (`final_warmup: 0.05`)", "explore_recipes_4x_b.csv",
     "apollo"),
    ("growlm's first Apollo (9, common recipe)", "recipes_4x_common_summary.csv", "apollo"),
)


@block("recipes-4x-limits", RESULTS_PAGE, *dict.fromkeys(s for _, s, _ in LIMIT_ROWS))
def recipes_4x_limits(*frames) -> str:
    data = dict(zip(dict.fromkeys(s for _, s, _ in LIMIT_ROWS), frames))
    rows = []
    for label, source, method in LIMIT_ROWS:
        r = row_of(data[source], method=method)
        cross = "-" if missing(r["crossover_share_mean"]) else f"{r['crossover_share_mean']:.2f}"
        rows.append([label, reached(r), pm(r["cost_ratio_mean"], r["cost_ratio_std"]),
                     f3(r["cost_ratio_small_free_mean"]), cross, f"{r['m1_final_val_loss']:.3f}"])
    return table(["arm", "reached", "cost ratio, members counted", "members free",
                  "crossover (share of M_0's budget)", "final loss"], rows)


@block("recipes-4x-start", RESULTS_PAGE, "explore_recipes_4x_a_comparison.csv")
def recipes_4x_start(df) -> str:
    plain = df[df["method"] == "hyperclone+zero_block"]["m1_step0_val_loss"]
    return sentence("recipes_4x_start", low=plain.min(), high=plain.max(), unigram=df["unigram_test_loss"].iloc[0])
