"""The multiplier's trend over sizes from an experiment's tables, and the command that prints it with its prediction.

growlm.trend fits the trend; this module gives it its points from any experiment's tables and prints it:
`points_from_comparison` reads comparison.csv rows (N = budget / tokens_per_param, M_1's shape being M_0's; each
seed's `seed_multiplier` and `seed_multiplier_free`), `comparison_from_curves` recomputes each arm's multipliers
from curves.csv files made anywhere (growlm.runs.multiplier_columns on the curves' run ends, as growlm.compare
computes them), `fit_trends` fits a trend per arm, budget and measure (the members counted, or free) and
`trend_table` reads each at a named size. The command

    python -m growlm.predict CURVES.csv [CURVES.csv ...] --params 124e6 --tokens-per-param 20

(and bench/predict.py, the same) prints them, so that runs made elsewhere can be read at a user's size.

Budgets: the trend is fitted at one budget in tokens per non-embedding parameter; a ladder's budgets are rounded to
whole batches at each size, so values within `BUDGET_TOLERANCE` of each other are one budget. A prediction asked for
at a budget no size was measured at is read off the trend at the measured budget nearest it in log, and says so.
Torch-free.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import pandas as pd
import yaml

from growlm.errors import GrowlmError
from growlm.family_specs import FAMILY_SPECS, family_spec
from growlm.runs import M1_ARM_KEYS, multiplier_columns
from growlm.shape import ModelShape
from growlm.train_config import SCHEMA
from growlm.trend import LEVEL, N_BOOT, Trend, fit_trend, fmt_params

BUDGET_TOLERANCE = 1.1  # tokens per parameter within 10% of each other are one budget (a batch's rounding apart)
MEASURES = {"counted": "seed_multiplier", "free": "seed_multiplier_free"}


# ------------------------------------------------------------------------------------------------------------------
# the inputs: comparison.csv rows, or curves.csv files made anywhere
# ------------------------------------------------------------------------------------------------------------------

POINT_KEYS = ("method", "n")  # an arm across sizes: its members' shape changes with the size, its method and n do not


def _budgets(tokens_per_param: pd.Series) -> pd.Series:
    """Each row's budget as the trend groups it: tokens per parameter within `BUDGET_TOLERANCE` of each other (a
    budget rounded to whole batches at each size) are one budget, named by their geometric mean to 3 digits."""
    values = sorted(set(tokens_per_param.dropna().astype(float)))
    groups, out = [], {}
    for v in values:
        if groups and v <= groups[-1][0] * BUDGET_TOLERANCE:
            groups[-1].append(v)
        else:
            groups.append([v])
    for g in groups:
        name = float(f"{math.exp(np.log(g).mean()):.3g}")
        out.update({v: name for v in g})
    return tokens_per_param.astype(float).map(out)


def points_from_comparison(comparison: pd.DataFrame) -> pd.DataFrame:
    """The trend's points from comparison.csv rows (any experiment's, several concatenated): one row per arm,
    size and seed: method, n, d1, L1, params (non-embedding: budget / tokens_per_param, M_1's shape being M_0's),
    tokens_per_param (the budget the trend groups by, `_budgets`), seed, multiplier and multiplier_free (the seed's
    own, `seed_multiplier` and `seed_multiplier_free`). A GrowlmError names the columns a comparison lacks (one made
    before the multiplier, or without tokens per parameter)."""
    need = [*POINT_KEYS, "d1", "L1", "budget", "seed", "tokens_per_param", *MEASURES.values()]
    missing = [c for c in need if c not in comparison]
    if missing:
        raise GrowlmError(f"the comparison lacks column(s) {', '.join(missing)}: it was made by a growlm without the "
                          f"effective compute multiplier (compare again to add them)")
    df = comparison.copy()
    df["params"] = df["budget"].astype(float) / df["tokens_per_param"].astype(float)
    df["tokens_per_param"] = _budgets(df["tokens_per_param"])
    # each seed's own multipliers (the arm's pooled ones, `multiplier` in comparison.csv, are not the trend's points)
    df = df[[*POINT_KEYS, "d1", "L1", "params", "tokens_per_param", "seed", *MEASURES.values()]].rename(
        columns={MEASURES["counted"]: "multiplier", MEASURES["free"]: "multiplier_free"})
    return df.drop_duplicates(subset=[*POINT_KEYS, "d1", "L1", "tokens_per_param", "seed"]).reset_index(
        drop=True)


def fit_trends(points: pd.DataFrame, *, n_boot: int = N_BOOT, level: float = LEVEL) -> list[tuple[dict, Trend]]:
    """A trend per arm (method, n), budget (tokens per parameter) and measure (the members counted, or free):
    [({method, n, tokens_per_param, measure}, Trend)], the refused ones too (`Trend.why`)."""
    out = []
    for (method, n, budget), g in points.groupby([*POINT_KEYS, "tokens_per_param"], sort=True):
        for measure in MEASURES:
            column = "multiplier" if measure == "counted" else "multiplier_free"
            if measure == "counted" and not pd.to_numeric(g[column], errors="coerce").notna().any():
                continue  # members of unknown cost: the free measure alone
            trend = fit_trend(g, column=column, n_boot=n_boot, level=level)
            out.append(({"method": method, "n": n, "tokens_per_param": budget, "measure": measure}, trend))
    return out


def trend_table(trends: list[tuple[dict, Trend]], predict: dict | None = None, seeds: int | None = None) -> pd.DataFrame:
    """One row per trend: its keys, sizes, seeds, slope with its interval, the Birge ratio, and, with `predict`
    ({params, tokens_per_param}), the prediction at predict's params for the trends at the measured budget nearest
    predict's tokens per parameter (`nearest_budget`)."""
    rows = []
    nearest = nearest_budget([k["tokens_per_param"] for k, _ in trends], predict["tokens_per_param"]) \
        if predict and trends else None
    for keys, t in trends:
        row = {**keys, "sizes": " ".join(fmt_params(s) for s in t.sizes), "seeds": " ".join(map(str, t.seeds)),
               "slope": t.slope, "slope_low": t.slope_low, "slope_high": t.slope_high, "scatter": t.scatter,
               "ok": t.ok, "why": t.why}
        if predict and t.ok and keys["tokens_per_param"] == nearest:
            p = t.predict(float(predict["params"]), seeds)
            row.update(predict_params=p.params, predict_tokens_per_param=float(predict["tokens_per_param"]),
                       predicted=p.multiplier, predicted_low=p.low, predicted_high=p.high, line_low=p.line_low,
                       line_high=p.line_high, predict_seeds=p.seeds, reach=p.reach, label=p.label)
        rows.append(row)
    return pd.DataFrame(rows)


def nearest_budget(budgets, tokens_per_param: float) -> float:
    """The measured budget (tokens per parameter) nearest `tokens_per_param` in log."""
    budgets = sorted(set(float(b) for b in budgets))
    return min(budgets, key=lambda b: abs(math.log(b / float(tokens_per_param))))


def model_defaults() -> dict:
    """The config schema's `model` defaults (null ones left out: the family's own settings stand in)."""
    props = yaml.safe_load(SCHEMA.read_text())["properties"]["model"]["properties"]
    return {k: v["default"] for k, v in props.items() if v.get("default") is not None}


def nonembedding_params(d1: int, L1: int, model: dict | None = None) -> int:
    """Non-embedding parameters (Kaplan et al.'s N, comparison.csv's `tokens_per_param` divisor) of a model of
    width d1 and depth L1 built with the config's `model` settings (family, head_dim, heads_per_kv, mlp_ratio; the
    schema's defaults where absent): its blocks and final norm, which neither the vocabulary nor the context
    changes."""
    model = {**model_defaults(), **{k: v for k, v in (model or {}).items() if v is not None}}
    family = model["family"]
    if family not in FAMILY_SPECS:
        raise GrowlmError(f"model family {family!r}: not one growlm has ({', '.join(FAMILY_SPECS)})")
    settings = {k: model.get(k, v) for k, v in family_spec(family).settings.items()}
    shape = ModelShape.of({"n_embd": int(d1), "n_layer": int(L1), "head_dim": int(model["head_dim"]),
                           "vocab_size": 1, "family": family, **settings})
    return int(shape.n_params - shape.embedding_params)


CURVES_NEED = ("d0", "L0", "d1", "L1", "n", "method", "seed", "budget", "arm", "run", "flops", "offset_flops",
               "val_loss", "is_end")


def read_curves(paths) -> pd.DataFrame:
    """curves.csv files (growlm's `results/eval/curves.csv`, a bench script's `*_curves.csv`) as one table, each
    file's runs its own (`source`); a missing, unreadable or incomplete file is a one-line GrowlmError naming it."""
    frames = []
    for i, path in enumerate(paths):
        try:
            df = pd.read_csv(path)
        except FileNotFoundError:
            raise GrowlmError(f"{path}: no such curves file") from None
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, IsADirectoryError) as err:
            raise GrowlmError(f"{path}: not a readable curves.csv ({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
        missing = [c for c in CURVES_NEED if c not in df]
        if missing:
            raise GrowlmError(f"{path}: not a curves.csv of growlm's (it lacks column(s) {', '.join(missing)})")
        frames.append(df.assign(source=i))
    if not frames:
        raise GrowlmError("no curves.csv file given")
    return pd.concat(frames, ignore_index=True)


def comparison_from_curves(curves: pd.DataFrame, *, model: dict | None = None, n_boot: int = N_BOOT) -> pd.DataFrame:
    """comparison.csv's multiplier columns recomputed from curves.csv rows (`read_curves`; `source` keeps the files'
    runs apart), one row per arm and seed, with tokens_per_param from d1 and L1 (`nonembedding_params`, `model`:
    the config's model settings). What growlm.compare reads, read off the curves' run ends: M_0's finished runs
    (every `is_end` row of M_0, its full runs and cooldown branches at every budget, the seed's), M_1's full run's
    end (its final loss and FLOPs, `offset_flops` being what it is charged before its refinement), its members'
    FLOPs the ends of their own curves (members without curves, pretrained ones: the offset is counted as growth,
    so counted and free agree); then growlm.runs.multiplier_columns, as the comparison computes them."""
    df = curves.copy()
    if "source" not in df:
        df["source"] = 0
    df["is_end"] = df["is_end"].astype(str).str.lower().isin(["true", "1"])
    df = df[df["is_end"] & pd.to_numeric(df["val_loss"], errors="coerce").notna()]
    arm = df["arm"].astype(str)
    combo = ["source", *M1_ARM_KEYS, "seed"]
    m0 = df[arm.str.startswith("M_0")].drop_duplicates(subset=["source", "d1", "L1", "budget", "seed", "run"])
    m0 = m0.assign(model=[f"{s} M_0 d1={d} L1={L} budget={b} seed={e}" for s, d, L, b, e in
                          zip(m0["source"], m0["d1"], m0["L1"], m0["budget"], m0["seed"])],
                   loss=m0["val_loss"].astype(float), flops=m0["flops"].astype(float) + m0["offset_flops"].astype(float))
    ends = df[arm.str.startswith("M_1") & (df["run"] == "full")]
    members = df[arm.str.startswith("m_")].groupby(combo)["flops"].sum().rename("small_flops")
    rows = ends.drop_duplicates(subset=combo).merge(members, how="left", left_on=combo, right_index=True)
    if rows.empty:
        raise GrowlmError("the curves hold no finished run of a grown model (no M_1 row with is_end)")
    rows["small_flops"] = rows["small_flops"].fillna(0.0)
    table = pd.DataFrame({**{k: rows[k].to_numpy() for k in combo},
                          "m1_final_val_loss": rows["val_loss"].astype(float).to_numpy(),
                          "m1_refine_flops": rows["flops"].astype(float).to_numpy(),
                          "small_flops": rows["small_flops"].to_numpy(),
                          "growth_flops": (rows["offset_flops"].astype(float) - rows["small_flops"]).to_numpy(),
                          "members_cost": "counted"})
    # M_0's finished runs for each arm and seed: its ends at every budget of that size and seed (as the comparison
    # pools an arm's M_0 over the sweep's budgets)
    at = ["source", "d1", "L1", "seed"]
    m0_ends = table[combo].astype(str).merge(m0[[*at, "model", "run", "flops", "loss"]].astype({k: str for k in at}),
                                             how="inner", on=at)
    parts = []
    for source, g in table.groupby("source", sort=True):  # each file's arms apart
        ends0 = m0_ends[m0_ends["source"] == str(source)]
        parts.append(multiplier_columns(g.reset_index(drop=True), ends0, n_boot=n_boot))
    out = pd.concat(parts, ignore_index=True)
    out["tokens_per_param"] = [float(b) / nonembedding_params(d, L, model)
                               for b, d, L in zip(out["budget"], out["d1"], out["L1"])]
    return out


def _number(text: str) -> float:
    """A positive number from the command line ('124e6', '20')."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m growlm.predict",
        description="The effective compute multiplier's trend over model sizes (log m = a + b log N per arm and "
                    "budget, members counted and free, with 95%% intervals from a bootstrap over seeds) from "
                    "curves.csv files (results/eval/curves.csv, bench/results/*_curves.csv: each arm's multiplier "
                    "recomputed from the runs' ends) or comparison.csv files, and what it predicts for a size "
                    "(docs/results.md, the multiplier's trend over sizes).")
    parser.add_argument("files", nargs="+", metavar="CSV", help="curves.csv or comparison.csv files")
    parser.add_argument("--params", type=_number, help="the size to predict: non-embedding parameters (e.g. 124e6)")
    parser.add_argument("--tokens-per-param", type=_number,
                        help="its budget in tokens per non-embedding parameter (the trend at the measured budget "
                             "nearest it)")
    parser.add_argument("--seeds", type=int, help="seeds the predicted size would be measured with (default: the "
                                                  "measured sizes' median)")
    parser.add_argument("--family", help="the models' family, for their parameter count (default gpt2)")
    parser.add_argument("--head-dim", type=int, help="the models' head size (default: the schema's)")
    parser.add_argument("--mlp-ratio", type=float, help="llama: MLP units per residual coordinate")
    parser.add_argument("--heads-per-kv", type=int, help="llama: query heads per key/value head")
    parser.add_argument("--n-boot", type=int, default=N_BOOT, help=f"bootstrap draws (default {N_BOOT})")
    parser.add_argument("--csv", help="also write the trend table to this CSV file")
    return parser


def points_from_files(paths, *, model: dict | None = None, n_boot: int = N_BOOT) -> pd.DataFrame:
    """The trend's points from curves.csv files (recomputed, `comparison_from_curves`) and comparison.csv files
    (read as they are, `points_from_comparison`), told apart by their columns."""
    curves, comparisons = [], []
    for path in paths:
        try:
            head = pd.read_csv(path, nrows=0).columns
        except FileNotFoundError:
            raise GrowlmError(f"{path}: no such file") from None
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, IsADirectoryError) as err:
            raise GrowlmError(f"{path}: not a readable CSV ({type(err).__name__})") from None
        if MEASURES["counted"] in head:
            comparisons.append(points_from_comparison(pd.read_csv(path)))
        else:
            curves.append(path)
    if curves:
        comparisons.append(points_from_comparison(comparison_from_curves(read_curves(curves), model=model,
                                                                         n_boot=n_boot)))
    points = pd.concat(comparisons, ignore_index=True)
    points["tokens_per_param"] = _budgets(points["tokens_per_param"])  # budgets named across every file
    return points


def describe(table: pd.DataFrame) -> list[str]:
    """The trend table as lines of text."""
    out = []
    for _, r in table.iterrows():
        head = (f"{r['method']} (n = {r['n']}), {r['tokens_per_param']:g} tokens per parameter, members "
                f"{r['measure']}: ")
        if not r["ok"]:
            out.append(head + f"no trend ({r['why']})")
            continue
        scatter = f"; size means scatter {r['scatter']:.2f} times what the seeds explain" if r["scatter"] == \
            r["scatter"] else "; two sizes: no check of the line"
        out.append(head + f"log m = a + {r['slope']:.3f} log N (95% interval {r['slope_low']:.3f} to "
                   f"{r['slope_high']:.3f}) over sizes {r['sizes']} with {r['seeds']} seeds{scatter}")
        if "predicted" in r and r["predicted"] == r["predicted"]:
            budget = "" if r["predict_tokens_per_param"] <= r["tokens_per_param"] * BUDGET_TOLERANCE and \
                r["tokens_per_param"] <= r["predict_tokens_per_param"] * BUDGET_TOLERANCE else \
                f" (no size was measured at {r['predict_tokens_per_param']:g} tokens per parameter: the trend at " \
                f"{r['tokens_per_param']:g})"
            out.append(f"  at {fmt_params(r['predict_params'])} non-embedding parameters{budget}: multiplier "
                       f"{r['predicted']:.2f}, 95% prediction interval {r['predicted_low']:.2f}-"
                       f"{r['predicted_high']:.2f} for a measurement over {int(r['predict_seeds'])} seeds (the "
                       f"trend itself {r['line_low']:.2f}-{r['line_high']:.2f}); {r['label']}")
    return out


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if (args.params is None) != (args.tokens_per_param is None):
        print("error: --params and --tokens-per-param go together (the size and the budget to predict)",
              file=sys.stderr)
        return 2
    model = {"family": args.family, "head_dim": args.head_dim, "mlp_ratio": args.mlp_ratio,
             "heads_per_kv": args.heads_per_kv}
    try:
        points = points_from_files(args.files, model=model, n_boot=args.n_boot)
        predict = {"params": args.params, "tokens_per_param": args.tokens_per_param} if args.params else None
        table = trend_table(fit_trends(points, n_boot=args.n_boot), predict, args.seeds)
    except GrowlmError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("\n".join(describe(table)))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
