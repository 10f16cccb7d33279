"""Section 8 of bench/RESULTS.md, the saving across budgets (`bench/budgets.py`): 400k to 6.4M tokens, and
8a's 25.6M tokens with each seed and the one seed against M_0 at another rate."""

from __future__ import annotations

from rendering.core import RESULTS_PAGE, arm, block, pm, rate, reached, sentence, table, tok


def _budget_rows(df) -> list[list[str]]:
    return [[arm(r["method"]), tok(r["budget"]), reached(r), pm(r["cost_ratio"], r["cost_ratio_std"]),
             pm(r["small_free"], r["small_free_std"]), f"{r['m0_final']:.3f} / {r['m0_best']:.3f}",
             f"{r['m1_final']:.3f} / {r['m1_best']:.3f}", f"{int(r['m1_best_below_m0_best'])}/{int(r['seeds'])}",
             f"{rate(r['m0_lr'])} / {rate(r['m1_lr'])}"] for _, r in df.iterrows()]


BUDGET_HEADER = ["arm", "M_0's budget", "reached", "cost ratio, members counted", "members free",
                 "M_0 final / best", "M_1 final / best", "M_1's best below M_0's best", "rates M_0 / M_1"]


@block("budgets", RESULTS_PAGE, "budgets_table.csv")
def budgets(df) -> str:
    return table(BUDGET_HEADER, _budget_rows(df))


@block("budgets-long", RESULTS_PAGE, "budgets_long_table.csv", "budgets_long_table_seeds.csv")
def budgets_long(df, seeds) -> str:
    m0_best = seeds.drop_duplicates("seed")["m0_best"]
    return table(BUDGET_HEADER, _budget_rows(df)) + "\n\n" + sentence(
        "budgets_long_seeds", arms=[(arm(method), [s for _, s in g.iterrows()])
                                    for method, g in seeds.groupby("method", sort=False)],
        low=m0_best.min(), high=m0_best.max())


@block("budgets-long-seed1", RESULTS_PAGE, "budgets_long_seed1.csv")
def budgets_long_seed1(df) -> str:
    r = df.iloc[0]
    return sentence("budgets_long_seed1", r=r, method=arm(r["method"]))
