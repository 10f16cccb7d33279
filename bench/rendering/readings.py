"""The sentences that read a table: a comparison (below or above M_0, reached on k of n seeds, rises or
falls) is computed here from the CSV that holds its figures and worded by a template in `templates/`, so the
prose around a table cannot say what its data do not.

Each function receives one frame (or parsed config) per source named in its `@block` line and returns the
block's Markdown through `sentence(template, **values)`.
"""

from __future__ import annotations

import pandas as pd

from rendering.core import RESULTS_PAGE, _merged, arm, block, m0_params, row_of, sentence, tpp


def says(ratio: float) -> str:
    """A cost ratio in words: below 0.9 growing pays, below 1 it hardly pays, from 1 on it does not."""
    return "pays" if ratio < 0.9 else "hardly pays" if ratio < 1 else "does not pay"


def full(df: pd.DataFrame, methods=None) -> list[str]:
    """The arms (as table cells) that reached M_0 on every seed, in the frame's order."""
    rows = df[df["reached"] == df["seeds"]]
    return [arm(m) for m in rows["method"] if methods is None or m in methods]


def _point(r, mean: str, std: str, tokens: int, per: int) -> dict:
    return {"mean": r[mean], "std": r[std], "reached": int(r["reached"]), "seeds": int(r["seeds"]),
            "tpp": tpp(tokens / per), "tokens": tokens}


@block("answer-reading", RESULTS_PAGE, "savings_summary.csv", "budgets_table.csv", "budgets_long_table.csv",
       "schedules_table.csv", "scaling_summary.csv", "families_summary.csv", "recipes_summary.csv",
       "recipes_4x_summary.csv", "recipes_4x_common_summary.csv", "config/config.yaml", "bench/savings.yaml")
def answer_reading(savings, budgets, long, schedules, scaling, families, recipes, authors_4x, common_4x, default,
                   bench) -> str:
    per = m0_params(_merged(default, bench))[0]
    msg = [_point(row_of(savings, method="msg", budget=b), "cost_ratio_mean", "cost_ratio_std", b, per)
           for b in (100000, 200000)]
    msg += [_point(r, "cost_ratio", "cost_ratio_std", int(r["budget"]), per)
            for _, r in budgets[budgets["method"] == "msg"].sort_values("budget").iterrows()]
    msg += [_point(row_of(long, method="msg"), "cost_ratio", "cost_ratio_std", int(long["budget"].iloc[0]), per)]
    low = min(range(len(msg)), key=lambda i: msg[i]["mean"])
    pair = row_of(long, method="msg_members+carry")
    longest = int(budgets["budget"].max())
    wsd = row_of(schedules, method="msg", schedule="wsd", m0_schedule="wsd", budget=longest)
    cos = row_of(schedules, method="msg", schedule="cosine (section 8)", m0_schedule="cosine", budget=longest)
    widths = []
    for d1, g in scaling.groupby("d1"):
        m = row_of(g, method="msg")
        others = g[(g["method"] != "msg") & (g["reached"] == g["seeds"])]
        widths.append({"d1": int(d1), "msg": m["cost_ratio_mean"],
                       "ahead": [arm(r["method"]) for _, r in others.iterrows()
                                 if r["cost_ratio_mean"] < m["cost_ratio_mean"]],
                       "below": [(arm(r["method"]), r["cost_ratio_mean"], r["cost_ratio_std"])
                                 for _, r in others.iterrows() if r["cost_ratio_mean"] < 1]})
    concat = {("GPT-2" if f == "gpt2" else "Llama"): row_of(families, family=f, method="concat")["cost_ratio"]
              for f in ("gpt2", "llama")}
    differ = [m for m in recipes["method"]]
    return sentence("answer_reading", msg=msg, low=low, pair=pair, long_tpp=msg[-1]["tpp"],
                    wsd=wsd, cos=cos, wsd_tpp=tpp(longest / per), says=says, widths=widths, concat=concat,
                    authors_200k=full(recipes), authors_800k=full(authors_4x, differ),
                    common_800k=full(common_4x, differ), budget_200k=int(recipes["budget"].iloc[0]),
                    budget_800k=int(authors_4x["budget"].iloc[0]))


@block("methods-verdict", RESULTS_PAGE, "savings_methods_summary.csv")
def methods_verdict(df) -> str:
    done = df[df["reached"] == df["seeds"]]
    below = done[done["cost_ratio_mean"] < 1].sort_values("cost_ratio_mean")
    return sentence("methods_verdict", n=len(done), every=[arm(m) for m in done["method"]],
                    below=[(arm(r["method"]), r["cost_ratio_mean"], r["cost_ratio_std"]) for _, r in below.iterrows()])


@block("families-control", RESULTS_PAGE, "families_summary.csv")
def families_control(df) -> str:
    def name(f):
        return "GPT-2" if f == "gpt2" else "Llama"
    concat = df[df["method"] == "concat"]
    control = df[df["method"] == "concat@m1"]
    return sentence("families_control", concat=[(name(r["family"]), r) for _, r in concat.iterrows()],
                    control=[(name(r["family"]), r) for _, r in control.iterrows()])


@block("budgets-long-best", RESULTS_PAGE, "budgets_long_table.csv")
def budgets_long_best(df) -> str:
    m0 = df["m0_best"].iloc[0]
    return sentence("budgets_long_best", m0=m0, arms=[(arm(r["method"]), r["m1_best"]) for _, r in df.iterrows()])


@block("recipes-4x-verdict", RESULTS_PAGE, "recipes_4x_summary.csv", "recipes_4x_common_summary.csv")
def recipes_4x_verdict(authors, common) -> str:
    def every(df):
        return [(arm(r["method"]), r["cost_ratio_mean"]) for _, r in df[df["reached"] == df["seeds"]].iterrows()]
    return sentence("recipes_4x_verdict", authors=every(authors), common=every(common))
