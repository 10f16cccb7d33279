"""The saving across budgets: a table and a plot from a finished bench/savings.py run over several budgets.

    .venv/bin/python bench/savings.py --run-dir bench/run_budgets --overlay bench/budgets.yaml \\
        --out bench/results/budgets_summary.csv                  # the runs (bench/budgets.yaml)
    .venv/bin/python bench/budgets.py --run-dir bench/run_budgets  # this table and plot

Per arm and budget, over the seeds: how many reached M_0's final validation loss, the cost ratio with the
members counted and free (mean and standard deviation over the seeds that reached it), and each arm's final
and *best* validation loss (the lowest of its evaluations; an arm that overfits has best < final). Each arm is
at its own best rate per budget (the workflow's choice, `lr_sweep.csv`). The best losses answer the question
that a longer budget raises: does the grown model end lower than training from scratch ever gets on this data?

Writes bench/results/budgets_table.csv (and its rows per seed, budgets_table_seeds.csv), prints it, and
draws bench/results/budgets_table.svg beside it (cost ratio against M_0's budget, members counted and free;
each arm's best loss against the budget).

A budget too long to sweep rates at (bench/budgets_long.yaml) trains each large arm at one rate only, so the
workflow's own comparison (every arm at every rate) is not made; `--fixed-rates` makes the same rows with
growlm's own comparison function (growlm.compare.compare_one: M_1 at its rate against M_0 at its rate) from the
models the run has, and `--long-targets` prints the models to ask the workflow for:

    .venv/bin/python bench/budgets.py --run-dir bench/run_budgets_long --fixed-rates \
        --out bench/results/budgets_long_table.csv --plot-with bench/results/budgets_table.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def best_losses(curves: pd.DataFrame) -> pd.DataFrame:
    """Each (method, seed, budget, arm): the final and the lowest validation loss of its curve."""
    c = curves[curves["run"] == "full"] if "run" in curves else curves  # whole runs, not cooldown branches
    c = c.dropna(subset=["val_loss"]).sort_values("step")
    g = c.groupby(["method", "seed", "budget", "arm"])["val_loss"]
    return pd.DataFrame({"final": g.last(), "best": g.min()}).reset_index()


# The long budget's arms (bench/budgets_long.yaml): the grown arms at the rate that was their best at every
# smaller budget (8e-3); M_0 at that budget's best (4e-3) and at 8e-3, which is its best at this one
# (bench/RESULTS.md, 8a): the arms are compared against M_0 at `m0_lr`.
LONG = {"budget": 25_600_000, "seeds": (0, 1, 2), "m0_lrs": ("0.004", "0.008"), "m0_lr": "0.008", "m1_lr": "0.008",
        "methods": ("msg", "msg_members+carry"), "d0": 32, "L0": 2, "d1": 64, "L1": 4, "n": 2}
PATHS = {"baseline": "results/models/baseline/d{d1}_L{L1}/t{budget}_lr{lr}/s{seed}",
         "grown": "results/models/grown/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/s{seed}",
         "refined": "results/models/refined/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/t{budget}_lr{lr}/s{seed}"}


def long_combos() -> list[dict]:
    keys = {k: LONG[k] for k in ("d0", "L0", "d1", "L1", "n", "budget")}
    return [{**keys, "method": m, "seed": s, "lr": LONG["m1_lr"]} for s in LONG["seeds"] for m in LONG["methods"]]


def long_targets() -> list[str]:
    """The evaluation files of the long budget's twelve models (M_0 at two rates and both arms, three
    seeds): what bench/budgets_long.yaml asks the workflow for."""
    out = []
    for c in long_combos():
        out.append(PATHS["refined"].format(**c).replace("models/", "eval/", 1) + "/metrics.json")
        for lr in LONG["m0_lrs"]:
            m0 = PATHS["baseline"].format(**{**c, "lr": lr}).replace("models/", "eval/", 1) + "/metrics.json"
            if m0 not in out:
                out.append(m0)
    return out


def fixed_rate_comparison(run: Path, m0_lr: str = LONG["m0_lr"]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The comparison rows and curves of the long budget's models, each M_1 against M_0 at the fixed rates,
    made by the function the workflow's compare rule uses (growlm.compare.compare_one)."""
    import os
    import sys

    sys.path.insert(0, str(REPO / "workflow" / "scripts"))
    from growlm.compare import compare_one

    here = os.getcwd()
    os.chdir(run)  # the growth records name the members' folders relative to the run
    try:
        rows, curves = [], []
        for c in long_combos():
            m0 = PATHS["baseline"].format(**{**c, "lr": m0_lr})
            if not all(Path(p, "ledger.csv").is_file() for p in (PATHS["refined"].format(**c), m0)):
                print(f"not trained (left out): {c['method']} seed {c['seed']} or its M_0 at {m0_lr}")
                continue
            row, cs = compare_one(c, PATHS, m0_lr=m0_lr)
            rows.append(row)
            curves.extend(cs)
    finally:
        os.chdir(here)
    if not rows:
        raise SystemExit(f"{run}: no arm of the long budget has both its refined model and M_0 at rate {m0_lr} "
                         f"trained; run the workflow for `bench/budgets.py --long-targets` first")
    return pd.DataFrame(rows), pd.concat(curves, ignore_index=True)


def seed_rows(run: Path, fixed_rates: bool = False, m0_lr: str = LONG["m0_lr"]) -> pd.DataFrame:
    """One row per arm, budget and seed: reached or not, the cost ratios, M_0's and M_1's final and best loss."""
    if fixed_rates:
        comparison, curves = fixed_rate_comparison(run, m0_lr)
    else:
        comparison = pd.read_csv(run / "results" / "eval" / "comparison.csv")
        curves = pd.read_csv(run / "results" / "eval" / "curves.csv")
    losses = best_losses(curves)
    m0 = losses[losses["arm"].str.startswith("M_0")].groupby(["method", "seed", "budget"])[["final", "best"]].first()
    m1 = losses[losses["arm"].str.startswith("M_1")].groupby(["method", "seed", "budget"])[["final", "best"]].first()
    df = comparison.join(m0.add_prefix("m0_"), on=["method", "seed", "budget"]) \
                   .join(m1.add_prefix("m1_"), on=["method", "seed", "budget"])
    df["reached"] = df["m1_flops_to_m0_loss"].notna()
    df["m1_best_below_m0_best"] = df["m1_best"] < df["m0_best"]
    return df[["method", "budget", "seed", "m0_lr", "m1_lr", "reached", "cost_ratio", "cost_ratio_small_free",
               "m0_final", "m0_best", "m1_final", "m1_best", "m1_best_below_m0_best"]]


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Per arm and budget, over the seeds (`seed_rows`)."""
    out = df.groupby(["method", "budget"]).agg(
        seeds=("seed", "nunique"), reached=("reached", "sum"), m0_lr=("m0_lr", "first"), m1_lr=("m1_lr", "first"),
        cost_ratio=("cost_ratio", "mean"), cost_ratio_std=("cost_ratio", "std"),
        small_free=("cost_ratio_small_free", "mean"), small_free_std=("cost_ratio_small_free", "std"),
        m0_final=("m0_final", "mean"), m0_best=("m0_best", "mean"),
        m1_final=("m1_final", "mean"), m1_best=("m1_best", "mean"),
        m1_best_below_m0_best=("m1_best_below_m0_best", "sum"),
    ).reset_index()
    return out.sort_values(["method", "budget"])


def plot(t: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for method, g in t.groupby("method"):
        line, = ax.plot(g["budget"], g["cost_ratio"], marker="o", label=f"{method}, members counted")
        ax.plot(g["budget"], g["small_free"], marker="o", ls="--", color=line.get_color(),
                label=f"{method}, members free")
        bx.plot(g["budget"], g["m1_best"], marker="o", color=line.get_color(), label=f"M_1 {method}")
    m0 = t.groupby("budget")["m0_best"].mean()
    bx.plot(m0.index, m0.values, marker="s", color="black", label="M_0 (scratch)")
    ax.axhline(1.0, color="grey", lw=0.8)
    for a in (ax, bx):
        a.set_xscale("log")
        a.set_xlabel("M_0's budget (tokens)")
    ax.set_ylabel("FLOPs to M_0's final loss / M_0's FLOPs")
    bx.set_ylabel("best validation loss (mean over seeds)")
    ax.legend(fontsize=7)
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default=str(REPO / "bench" / "run_budgets"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "budgets_table.csv"))
    ap.add_argument("--fixed-rates", action="store_true",
                    help="the long budget's models at their fixed rates (bench/budgets_long.yaml), not the workflow's comparison")
    ap.add_argument("--m0-lr", default=LONG["m0_lr"],
                    help="with --fixed-rates: the rate of the M_0 the arms are compared against (its folder's t..._lr<this>)")
    ap.add_argument("--seeds-out", default=None,
                    help="where the per-seed rows go (default: beside --out, named <out>_seeds.csv)")
    ap.add_argument("--long-targets", action="store_true", help="print the long budget's targets and stop")
    ap.add_argument("--plot-with", action="append", default=[], metavar="CSV",
                    help="another table of this script's to draw in the plot (e.g. bench/results/budgets_table.csv)")
    args = ap.parse_args(argv)
    if args.long_targets:
        print(" ".join(long_targets()))
        return 0
    rows = seed_rows(Path(args.run_dir), fixed_rates=args.fixed_rates, m0_lr=args.m0_lr)
    rows.sort_values(["method", "budget", "seed"]).to_csv(args.seeds_out or Path(args.out).with_name(
        Path(args.out).stem + "_seeds.csv"), index=False)
    t = table(rows)
    t.to_csv(args.out, index=False)
    # the plot draws the tables given with --plot-with too (the swept budgets beside the long one)
    plot(pd.concat([*(pd.read_csv(f) for f in args.plot_with), t], ignore_index=True).sort_values(["method", "budget"]),
         Path(args.out).with_suffix(".svg"))
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print(t.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
