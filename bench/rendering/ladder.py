"""Section 16 of bench/RESULTS.md (`bench/ladder.py`): the size ladder on text seen once, the trend of the multiplier
over sizes, the prediction written before the next size ran and its check, what the papers report beside it; and
README's sentence on how the saving moves with size."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rendering.core import README_PAGE, RESULTS_PAGE, block, missing, sentence, table, tpp
from rendering.multiplier import extrapolated, interval, said, verdict

TABLE, TREND, PREDICTION, SEEDS = "ladder_table.csv", "ladder_trend.csv", "ladder_prediction.csv", "ladder_seeds.csv"


def params_text(n: float) -> str:
    """Non-embedding parameters: '28.9k', '1.2M'."""
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def tokens_text(n: float) -> str:
    """A budget in tokens: '231k', '1.60M'."""
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def _loss(r: pd.Series, who: str) -> str:
    sd = r[f"{who}_final_val_loss_std"]
    return f"{r[f'{who}_final_val_loss']:.3f}" + ("" if missing(sd) else f" (sd {sd:.3f})")


@block("ladder", RESULTS_PAGE, TABLE)
def ladder_table(df) -> str:
    header = ["d1 (member d0)", "non-embedding parameters", "M_0's tokens (per parameter; passes over its text)", "arm",
              "members' FLOPs / M_0's", "seeds", "multiplier, members counted (95% interval)",
              "members free (95% interval)", "verdict", "extrapolated", "M_0 final loss (sd over seeds)",
              "M_1 final loss (sd over seeds)"]
    rows = []
    for _, r in df.assign(_tpp=df["tokens_per_param"].round()).sort_values(["_tpp", "d1", "arm"]).iterrows():
        rows.append([f"{int(r['d1'])} ({int(r['d0'])})", params_text(r["params"]),
                     f"{tokens_text(r['budget'])} ({tpp(r['tokens_per_param'])}; {r['m0_passes']:.2f} passes)",
                     r["arm"],
                     f"{r['small_flops_share']:.3f}", int(r["seeds"]), interval(r), interval(r, "multiplier_free"),
                     verdict(r), extrapolated(r), _loss(r, "m0"), _loss(r, "m1")])
    return table(header, rows)


def _slope(r: pd.Series) -> str:
    return f"{r['slope']:+.3f} ({r['slope_low']:+.3f} to {r['slope_high']:+.3f})"


def _per_doubling(r: pd.Series) -> str:
    """The slope as the factor the multiplier changes by when N doubles, with its interval."""
    return f"x{2 ** r['slope']:.2f} ({2 ** r['slope_low']:.2f}-{2 ** r['slope_high']:.2f})"


@block("ladder-trend", RESULTS_PAGE, TREND)
def ladder_trend(df) -> str:
    header = ["tokens per parameter", "arm", "members", "sizes (non-embedding parameters)", "seeds",
              "slope of log m on log N (95% interval)", "multiplier per doubling of N",
              "scatter of the size means (Birge ratio)"]
    rows = []
    for _, r in df.iterrows():
        if not bool(r["ok"]):
            rows.append([tpp(r["tokens_per_param"]), r["method"], r["measure"],
                         r["sizes"] if not missing(r["sizes"]) else "-", "-", f"no trend: {r['why']}", "-", "-"])
            continue
        rows.append([tpp(r["tokens_per_param"]), r["method"], r["measure"], r["sizes"], r["seeds"], _slope(r),
                     _per_doubling(r),
                     "-" if missing(r["scatter"]) else f"{r['scatter']:.2f}"])
    return table(header, rows)


def measured(seeds: pd.DataFrame, d1: int, arm: str, measure: str) -> tuple[float, int]:
    """What a prediction is checked against: the geometric mean over seeds of each seed's multiplier at width d1
    (growlm.trend's measurement of a size), and the seed count."""
    column = "seed_multiplier" if measure == "counted" else "seed_multiplier_free"
    rows = seeds[(seeds["d1"] == d1) & (seeds["arm"] == arm)]
    values = pd.to_numeric(rows[column], errors="coerce").dropna()
    values = values[values > 0]
    return (float(np.exp(np.log(values).mean())) if len(values) else math.nan), len(values)


def checks(pred: pd.DataFrame, seeds: pd.DataFrame) -> list[dict]:
    out = []
    for _, r in pred.iterrows():
        if missing(r.get("predicted")):
            continue
        value, k = measured(seeds, int(r["predicted_d1"]), r["method"], r["measure"])
        inside = None if missing(value) else bool(r["predicted_low"] <= value <= r["predicted_high"])
        out.append({"row": r, "value": value, "seeds": k, "inside": inside})
    return out


@block("ladder-prediction", RESULTS_PAGE, PREDICTION, SEEDS)
def ladder_prediction(pred, seeds) -> str:
    header = ["arm", "members", "predicted at d1 (non-embedding parameters)", "from sizes (d1)",
              "predicted multiplier", "95% prediction interval (the line's)", "reach past the largest size",
              "measured (geometric mean over seeds)", "inside the interval"]
    rows = []
    for c in checks(pred, seeds):
        r = c["row"]
        rows.append([r["method"], r["measure"], f"{int(r['predicted_d1'])} ({params_text(r['predict_params'])})",
                     str(r["from_sizes"]).replace(" ", ", "), f"{r['predicted']:.2f}",
                     f"{r['predicted_low']:.2f}-{r['predicted_high']:.2f} ({r['line_low']:.2f}-{r['line_high']:.2f})",
                     f"x{r['reach']:.2f}",
                     "not measured yet" if missing(c["value"]) else f"{c['value']:.2f} ({c['seeds']} seeds)",
                     "-" if c["inside"] is None else ("yes" if c["inside"] else "no")])
    return table(header, rows)


@block("ladder-published", RESULTS_PAGE, "bench/published_sizes.csv")
def ladder_published(df) -> str:
    header = ["work", "sizes", "budget", "what it reports about size", "read from"]
    def who(r) -> str:
        authors = r["authors"] if isinstance(r["authors"], str) and r["authors"] else ""
        return f"{r['method']} ({authors + ', ' if authors else ''}{r['year']}, arXiv {r['arxiv']})"

    rows = [[who(r), r["sizes"], r["budget"], r["reports"], r["where"]] for _, r in df.iterrows()]
    return table(header, rows)


def _counted_checks(pred: pd.DataFrame, seeds: pd.DataFrame) -> list[dict]:
    return [c for c in checks(pred, seeds) if c["row"]["measure"] == "counted"]


def _counted(trend: pd.DataFrame) -> list[pd.Series]:
    return [r for _, r in trend.iterrows() if r["measure"] == "counted" and bool(r["ok"])]


@block("ladder-reading", RESULTS_PAGE, TABLE, TREND, PREDICTION, SEEDS)
def ladder_reading(tab, trend, pred, seeds) -> str:
    sizes = sorted({(int(d), float(p)) for d, p in zip(tab["d1"], tab["params"])})
    return sentence("ladder_reading", sizes=sizes, tpp=tpp, params_text=params_text, trends=_counted(trend), slope=_slope,
                    per_doubling=_per_doubling, checks=_counted_checks(pred, seeds),
                    rows=[r for _, r in tab.assign(_tpp=tab["tokens_per_param"].round()).sort_values(["_tpp", "arm", "d1"]).iterrows()], interval=interval, said=said)


@block("readme-ladder", README_PAGE, TABLE, TREND, PREDICTION, SEEDS)
def readme_ladder(tab, trend, pred, seeds) -> str:
    main = tab[tab["tokens_per_param"] < tab["tokens_per_param"].min() * 1.1]  # the ladder's own budget
    sizes = sorted({float(p) for p in main["params"]})
    trends = [t for t in _counted(trend) if t["tokens_per_param"] < main["tokens_per_param"].min() * 1.1]
    return sentence("readme_ladder", smallest=params_text(sizes[0]), largest=params_text(sizes[-1]),
                    tpp=main["tokens_per_param"].iloc[0], trends=trends, slope=_slope,
                    per_doubling=_per_doubling, checks=_counted_checks(pred, seeds))


@block("ladder-setting", RESULTS_PAGE, "bench/ladder.yaml", TABLE)
def ladder_setting(cfg, tab) -> str:
    extend = cfg["baseline"]["extend"]
    main = tab[tab["tokens_per_param"] < tab["tokens_per_param"].min() * 1.1]  # the ladder's own budget
    sizes = main.drop_duplicates("d1").sort_values("d1")
    lrs = sorted(cfg["lrs"])
    return sentence("ladder_setting", tokens_text=tokens_text, vocab=cfg["tokenizer"]["vocab_size"],
                    L1=cfg["L1"][0], L0=cfg["L0"][0],
                    head_dim=cfg["model"]["head_dim"], tpp=sizes["tokens_per_param"].iloc[0],
                    sizes=[r for _, r in sizes.iterrows()], max_passes=extend * tab["m0_passes"].max(),
                    extend=f"{extend:g}", m0_lr=f"{lrs[0]:.0e}".replace("e-0", "e-"),
                    arm_lr=f"{lrs[-1]:.0e}".replace("e-0", "e-"), wd=f"{cfg['weight_decays'][0]:g}")
