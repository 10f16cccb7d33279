"""The first screen of bench/RESULTS.md and the README's answer: the machine-read headline line and its
sentence, the table of every setting measured (`answer`), the scale of the models, and the README's summary.

The headline is the lowest mean cost ratio, members counted, over the arms that reached M_0 on every seed of
at least three, among every summary measured at the savings benchmark's setting or beside it
(`HEADLINE_SOURCES`); the same run summarised again by a later file counts once.
"""

from __future__ import annotations

import pandas as pd

from rendering.core import (README_PAGE, RESULTS_PAGE, _merged, arm, block, f3, m0_params, millions, pm, reached,
                            row_of, sentence, table, tok, tpp)

# Every summary of an arm compared with M_0 trained the same way (same schedule, its best rate) at the savings
# benchmark's setting or beside it; the headline is the lowest mean among those that reached M_0 on every seed.
HEADLINE_SOURCES = ("savings_summary.csv", "savings_ramp9_summary.csv", "savings_methods_summary.csv",
                    "explore_carry.csv", "explore_cross_zero.csv", "explore_members_50k.csv", "explore_msg.csv",
                    "explore_msg_carry.csv", "explore_msg_members_50k.csv", "explore_msg_members_450k.csv",
                    "explore_msg_members_450k_800k.csv", "explore_msg_ramp40.csv", "combine_seed_summary.csv",
                    "combine_carry_rates_summary.csv", "combine_shards_summary.csv", "combine_clusters_summary.csv",
                    "combine_trunk_summary.csv", "combine_trunk_average_summary.csv", "combine_n4_summary.csv",
                    "combine_n4_merge_summary.csv", "combine_n4_transition_summary.csv", "budgets_summary.csv",
                    "recipes_summary.csv", "recipes_4x_summary.csv", "recipes_4x_common_summary.csv",
                    "explore_recipes_4x_a.csv", "explore_recipes_4x_b.csv", "explore_recipes_4x_c.csv")


HEADLINE_NOTES = {"combine_trunk_summary.csv": ", section 5: m_1 trained on a shared trunk, then on one cluster of books",
                  "combine_clusters_summary.csv": ", section 5: m_1 trained on one cluster of books",
                  "explore_msg_members_450k_800k.csv": ", section 1c: m_1 trained 450k tokens"}


def _arms(frames) -> pd.DataFrame:
    """Every arm of the headline's sources, once (the same run summarised again by a later file counts once:
    the same method, budget, seeds reached, cost ratio and final loss)."""
    rows = []
    for source, df in zip(HEADLINE_SOURCES, frames):
        for _, r in df.iterrows():
            rows.append({"source": source, "method": r["method"], "budget": int(r["budget"]),
                         "seeds": int(r["seeds"]), "reached": int(r["reached"]), "mean": r["cost_ratio_mean"],
                         "std": r["cost_ratio_std"], "free": r["cost_ratio_small_free_mean"],
                         "final": r["m1_final_val_loss"]})
    arms = pd.DataFrame(rows, columns=["source", "method", "budget", "seeds", "reached", "mean", "std", "free",
                                       "final"])
    key = [(r.method, r.budget, r.reached, f"{r.mean:.6f}", f"{r.final:.5f}") for r in arms.itertuples()]
    return arms[~pd.Series(key, index=arms.index).duplicated()]


def headline_arm(frames) -> tuple[pd.Series, int]:
    arms = _arms(frames)
    full = arms[(arms["reached"] == arms["seeds"]) & (arms["seeds"] >= 3)]
    return full.sort_values("mean").iloc[0], len(arms)


def headline_line(frames) -> str:
    """The first line of bench/RESULTS.md, read by programs."""
    best, _ = headline_arm(frames)
    return f"headline: cost_ratio={best['mean']:.3f} method={best['method']} seeds={best['seeds']}"


@block("headline", RESULTS_PAGE, *HEADLINE_SOURCES, "savings_summary.csv")
def headline_sentence(*frames) -> str:
    *arms, main = frames
    best, n = headline_arm(arms)
    msg = row_of(main, method="msg", budget=400000)
    return sentence("headline", best=best, n=n, msg=msg, note=HEADLINE_NOTES.get(best["source"], ""),
                    gap=(msg["cost_ratio_mean"] - best["mean"]) / best["std"])


ANSWER_SOURCES = ("savings_summary.csv", "budgets_table.csv", "budgets_long_table.csv", "schedules_table.csv",
                  "families_summary.csv", "scaling_summary.csv", "config/config.yaml", "bench/savings.yaml",
                  "bench/scaling.yaml", "config/llama.yaml")


@block("answer", RESULTS_PAGE, *ANSWER_SOURCES)
def answer(savings, budgets, long, schedules, families, scaling, default, bench, scaling_cfg, llama) -> str:
    """One row per setting measured: a new row is one `add(...)`."""
    small = m0_params(_merged(default, bench))
    big = m0_params(default)
    big_llama = m0_params(_merged(default, llama))
    sc = {d1: m0_params(_merged(default, scaling_cfg), d1=d1) for d1 in (128, 256)}
    header = ["M_0: width x layers (parameters, all / non-embedding)", "M_0's tokens (per non-embedding parameter)",
              "schedule", "arm (members counted)", "reached M_0", "cost ratio, members counted", "members free",
              "section"]
    rows = []
    where = f"64 x 4 ({millions(small[1])} / {millions(small[0])})"

    def add(setting, tokens, params, schedule, method, members, r, mean, std, free, section):
        rows.append([setting, f"{tok(tokens)} ({tpp(tokens / params[0])})", schedule,
                     f"{arm(method)} ({members})", reached(r), pm(r[mean], r[std]), f3(r[free]), section])

    for b in (100000, 200000):
        r = row_of(savings, method="msg", budget=b)
        add(where, b, small, "cosine", "msg", "m_1", r, "cost_ratio_mean", "cost_ratio_std",
            "cost_ratio_small_free_mean", "1a")
    for b in (400000, 1600000, 6400000):
        r = row_of(budgets, method="msg", budget=b)
        add(where, b, small, "cosine", "msg", "m_1", r, "cost_ratio", "cost_ratio_std", "small_free", "8")
    for m, members in (("msg", "m_1"), ("msg_members+carry", "m_1, m_2")):
        r = row_of(long, method=m)
        add(where, int(r["budget"]), small, "cosine", m, members, r, "cost_ratio", "cost_ratio_std", "small_free",
            "8a")
    for b in (400000, 6400000):
        r = row_of(schedules, method="msg", schedule="wsd", m0_schedule="wsd", budget=b)
        add(where, b, small, "wsd", "msg", "m_1", r, "cost_ratio", "cost_ratio_std", "small_free", "14")
    for d1 in (128, 256):
        r = row_of(scaling, d1=d1, method="msg")
        add(f"{d1} x 4 ({millions(sc[d1][1])} / {millions(sc[d1][0])})", int(r["budget"]), sc[d1], "cosine", "msg",
            "m_1", r, "cost_ratio_mean", "cost_ratio_std", "cost_ratio_small_free_mean", "7")
    budget = default["train"]["large"]["tokens"]
    for family, params, m, members in (("gpt2", big, "msg", "m_1"), ("gpt2", big, "concat", "m_1, m_2"),
                                       ("llama", big_llama, "msg", "m_1")):
        r = row_of(families, family=family, method=m)
        name = "GPT-2" if family == "gpt2" else "Llama"
        add(f"128 x 4, {name} ({millions(params[1])} / {millions(params[0])})", budget, params, "cosine", m,
            members, r, "cost_ratio", "cost_ratio_std", "small_free", "10")
    return table(header, rows)


@block("scale", RESULTS_PAGE, "config/config.yaml", "bench/savings.yaml", "bench/scaling.yaml", "config/llama.yaml")
def scale(default, bench, scaling_cfg, llama) -> str:
    small = m0_params(_merged(default, bench))
    sc = {d1: m0_params(_merged(default, scaling_cfg), d1=d1) for d1 in (64, 128, 256)}
    big, big_llama = m0_params(default), m0_params(_merged(default, llama))
    return sentence("scale", small=small, big=big, big_llama=big_llama,
                    largest=max([small, big, big_llama, *sc.values()], key=lambda p: p[1]))


@block("readme-answer", README_PAGE, "budgets_table.csv", "schedules_table.csv", "families_summary.csv",
       "scaling_summary.csv", "config/config.yaml", "bench/savings.yaml", "bench/scaling.yaml")
def readme_answer(budgets, schedules, families, scaling, default, bench, scaling_cfg) -> str:
    small = m0_params(_merged(default, bench))
    msg = budgets[budgets["method"] == "msg"].sort_values("budget")
    first, last = msg.iloc[0], msg.iloc[-1]
    big = m0_params(default)
    return sentence("readme_answer", small=small, first=first, last=last, per=small[0],
                    largest=m0_params(_merged(default, scaling_cfg), d1=int(scaling["d1"].max())),
                    big_tpp=default["train"]["large"]["tokens"] / big[0],
                    wsd=row_of(schedules, method="msg", schedule="wsd", m0_schedule="wsd", budget=int(last["budget"])),
                    gpt2=row_of(families, family="gpt2", method="msg"))
