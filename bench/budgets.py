"""The saving across budgets: a table and a plot from a finished bench/savings.py run over several budgets.

    .venv/bin/python bench/savings.py --run-dir bench/run_budgets --overlay bench/budgets.yaml \\
        --out bench/results/budgets_summary.csv                  # the runs (bench/budgets.yaml)
    .venv/bin/python bench/budgets.py --run-dir bench/run_budgets  # this table and plot

Per arm and budget, over the seeds: how many reached M_0's final validation loss, the cost ratio with the
members counted and free (mean and standard deviation over the seeds that reached it), and each arm's final
and *best* validation loss (the lowest of its evaluations; an arm that overfits has best < final). Each arm is
at its own best rate per budget (the workflow's choice, `lr_sweep.csv`). The best losses answer the question
that a longer budget raises: does the grown model end lower than training from scratch ever gets on this data?

Writes bench/results/budgets_table.csv, prints it, and draws bench/results/budgets_table.svg beside it (cost ratio against
M_0's budget, members counted and free; each arm's best loss against the budget).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def best_losses(curves: pd.DataFrame) -> pd.DataFrame:
    """Each (method, seed, budget, arm): the final and the lowest validation loss of its curve."""
    c = curves.dropna(subset=["val_loss"]).sort_values("step")
    g = c.groupby(["method", "seed", "budget", "arm"])["val_loss"]
    return pd.DataFrame({"final": g.last(), "best": g.min()}).reset_index()


def table(run: Path) -> pd.DataFrame:
    comparison = pd.read_csv(run / "results" / "eval" / "comparison.csv")
    losses = best_losses(pd.read_csv(run / "results" / "eval" / "curves.csv"))
    m0 = losses[losses["arm"].str.startswith("M_0")].groupby(["method", "seed", "budget"])[["final", "best"]].first()
    m1 = losses[losses["arm"].str.startswith("M_1")].groupby(["method", "seed", "budget"])[["final", "best"]].first()
    df = comparison.join(m0.add_prefix("m0_"), on=["method", "seed", "budget"]) \
                   .join(m1.add_prefix("m1_"), on=["method", "seed", "budget"])
    df["reached"] = df["m1_flops_to_m0_loss"].notna()
    df["m1_best_below_m0_best"] = df["m1_best"] < df["m0_best"]
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
    args = ap.parse_args(argv)
    t = table(Path(args.run_dir))
    t.to_csv(args.out, index=False)
    plot(t, Path(args.out).with_suffix(".svg"))
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print(t.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
