"""Section 15 of bench/RESULTS.md measured again (`bench/multiplier.py`): each arm's effective compute multiplier
with its 95% interval over seeds, read off M_0's finished runs, at 8 and 32 tokens per non-embedding parameter; the
answer's line for it at the top of RESULTS and in README."""

from __future__ import annotations

import pandas as pd

from rendering.core import (README_PAGE, RESULTS_PAGE, _merged, block, f3, m0_params, millions, missing, pm,
                            sentence, table, tok, tpp)

SOURCES = ("multiplier_table.csv",)


def interval(r: pd.Series, name: str = "multiplier") -> str:
    """'1.07 (0.95-1.21)': the multiplier and its 95% interval; '-' where M_0's fit was refused."""
    if missing(r[name]):
        return "-"
    low, high = r[f"{name}_low"], r[f"{name}_high"]
    if missing(low) or missing(high):
        return f"{r[name]:.2f} (no interval)"
    return f"{r[name]:.2f} ({low:.2f}-{high:.2f})"


def verdict(r: pd.Series) -> str:
    return {"saving": "saving", "costs more": "costs more", "no measurable saving": "no measurable saving"}.get(
        str(r["saving"]), "no interval")


def said(r: pd.Series) -> str:
    """The verdict in a sentence."""
    return {"saving": "a saving", "costs more": "more than M_0 needs (its interval below 1)",
            "no measurable saving": "no measurable saving (its interval holds 1)"}.get(str(r["saving"]),
                                                                                      "no interval")


def extrapolated(r: pd.Series) -> str:
    return f"yes, x{r['extrapolation_factor']:.2f}" if str(r["extrapolated"]).lower() in ("true", "1") else "no"


def loss_se(r: pd.Series, who: str) -> str:
    """'3.717 ± 0.004 (sd 0.016)': the mean final loss over the seeds, its mean standard error as evaluated, and
    its spread over the seeds."""
    se = r[f"{who}_final_val_loss_se"]
    sd = r[f"{who}_final_val_loss_std"]
    return (f"{r[f'{who}_final_val_loss']:.3f}" + ("" if missing(se) else f" ± {se:.3f}")
            + ("" if missing(sd) else f" (sd {sd:.3f})"))


def _budgets(df: pd.DataFrame) -> list[int]:
    return sorted({int(b) for b in df["budget"]})


@block("multiplier", RESULTS_PAGE, *SOURCES)
def multiplier_table(df) -> str:
    header = ["M_0's tokens (per non-embedding parameter; passes over its text)", "arm", "members' FLOPs / M_0's",
              "seeds", "multiplier, members counted (95% interval)", "members free (95% interval)", "verdict",
              "extrapolated", "cost ratio by envelope of finished runs, counted", "within one schedule, counted",
              "M_0 final loss ± se (sd over seeds)", "M_1 final loss ± se (sd over seeds)",
              "se of M_1's loss - M_0's, same windows"]
    rows = []
    for budget in _budgets(df):
        for _, r in df[df["budget"] == budget].iterrows():
            rows.append([f"{tok(budget)} ({tpp(r['tokens_per_param'])}; {r['m0_passes']:.1f} passes)", r["arm"],
                         f"{r['small_flops_share']:.3f}", int(r["seeds"]), interval(r), interval(r, "multiplier_free"),
                         verdict(r), extrapolated(r), pm(r["envelope_ratio"], r["envelope_ratio_std"]),
                         pm(r["cost_ratio"], r["cost_ratio_std"]), loss_se(r, "m0"), loss_se(r, "m1"),
                         "-" if missing(r.get("eval_se")) else f"{r['eval_se']:.4f}"])
    return table(header, rows)


def _per_budget(df: pd.DataFrame) -> list[dict]:
    out = []
    for budget in _budgets(df):
        at = df[df["budget"] == budget]
        msg = at[at["arm"] == "msg"]
        best = at.sort_values("multiplier", ascending=False).iloc[0]
        out.append({"budget": budget, "tpp": at["tokens_per_param"].iloc[0], "passes": at["m0_passes"].iloc[0],
                    "msg": msg.iloc[0] if len(msg) else None, "best": best,
                    "saving_arms": [r["arm"] for _, r in at.iterrows() if str(r["saving"]) == "saving"],
                    "arms": len(at)})
    return out


@block("multiplier-answer", RESULTS_PAGE, *SOURCES)
def multiplier_answer(df) -> str:
    return sentence("multiplier_answer", budgets=_per_budget(df), interval=interval, said=said)


@block("readme-multiplier", README_PAGE, *SOURCES, "config/config.yaml", "bench/envelope.yaml")
def readme_multiplier(df, default, env_cfg) -> str:
    params = m0_params(_merged(default, env_cfg))
    return sentence("readme_multiplier", budgets=_per_budget(df), interval=interval, said=said,
                    params=millions(params[1]), f3=f3)


def _arms(df: pd.DataFrame) -> list[dict]:
    """Per budget, its arms in the table's order with what the reading says of each."""
    out = []
    for budget in _budgets(df):
        at = df[df["budget"] == budget]
        m0 = at.iloc[0]
        out.append({"budget": budget, "tpp": m0["tokens_per_param"], "rows": [r for _, r in at.iterrows()],
                    "m0_se": m0["m0_final_val_loss_se"], "m0_sd": m0["m0_final_val_loss_std"],
                    "m0_seeds": m0["m0_seeds"], "cut_arms": [a for a in ARMS if a not in set(at["arm"])],
                    "paired": at["eval_se"].dropna().tolist() if "eval_se" in at else []})
    return out


@block("multiplier-reading", RESULTS_PAGE, *SOURCES, "config/config.yaml", "bench/envelope.yaml")
def multiplier_reading(df, default, env_cfg) -> str:
    val_fraction = _merged(default, env_cfg)["corpus"]["val_fraction"]
    return sentence("multiplier_reading", budgets=_arms(df), interval=interval, said=said,
                    whole=1 / val_fraction, val_fraction=val_fraction,
                    extrapolated=extrapolated, missing=missing, measured=sorted(BUDGET_KEYS[b] for b in _budgets(df)
                                                                                if b in BUDGET_KEYS),
                    cut=[k for b, k in BUDGET_KEYS.items() if b not in _budgets(df)])


BUDGET_KEYS = {1_600_000: "8", 6_400_000: "32"}  # bench/multiplier.py's budgets, by tokens per parameter
ARMS = ("msg", "msg, members 1%", "msg, members 10%", "msg, members 10% + teach")  # and its ARMS
