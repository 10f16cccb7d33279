"""The savings benchmark: how much compute does growing from small models save?

Runs the workflow with bench/savings.yaml (3 seeds, 3 budgets, the growth methods and controls) in
bench/run/, then summarises results/eval/comparison.csv into bench/RESULTS.md:

  cost ratio = (FLOPs of all n small models + growth + refinement FLOPs until M_1 first reaches
                M_0's final validation loss) / M_0's total FLOPs

per method and budget, with the spread over seeds, the same in wall-clock seconds, the ratio with
the small models treated as free (labelled so), and the loss gap at equal total FLOPs.

    python bench/savings.py            # run (about 40 min on 2 cores) and summarise
    python bench/savings.py --summarise-only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench" / "run"


def run_workflow(cores: int, extra: list[str], overlays: list[str] = (), run: Path = RUN) -> None:
    run.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "--directory", str(run),
           "--configfile", str(REPO / "config" / "config.yaml"), str(REPO / "bench" / "savings.yaml"),
           *[str(Path(o).resolve()) for o in overlays], "--cores", str(cores),
           "--workflow-profile", "none", *extra]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def summarise(comparison_csv: Path) -> tuple[pd.DataFrame, str]:
    df = pd.read_csv(comparison_csv)
    df["reached"] = df["m1_flops_to_m0_loss"].notna()
    g = df.groupby(["method", "budget"])
    table = g.agg(seeds=("seed", "nunique"), reached=("reached", "sum"),
                  m0_lr=("m0_lr", "first"), m1_lr=("m1_lr", "first"),
                  cost_ratio_mean=("cost_ratio", "mean"), cost_ratio_std=("cost_ratio", "std"),
                  cost_ratio_small_free_mean=("cost_ratio_small_free", "mean"),
                  wall_ratio_mean=("wall_ratio", "mean"),
                  loss_gap_equal_flops_mean=("loss_gap_equal_flops", "mean"),
                  m0_final_val_loss=("m0_final_val_loss", "mean"),
                  m1_final_val_loss=("m1_final_val_loss", "mean"),
                  **({"ensemble_test_loss": ("ensemble_test_loss", "mean")}
                     if "ensemble_test_loss" in df else {})).reset_index()  # absent without the ensemble control
    full = table[table["reached"] == table["seeds"]]  # a method counts only if every seed got there
    if len(full):
        best = full.sort_values("cost_ratio_mean").iloc[0]
        headline = (f"headline: cost_ratio={best['cost_ratio_mean']:.3f} method={best['method']} "
                    f"seeds={int(best['seeds'])}")
    else:
        headline = "headline: cost_ratio=nan method=none seeds=0"
    return table, headline


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--summarise-only", action="store_true")
    ap.add_argument("--run-dir", default=str(RUN), help="the workflow's working directory (default bench/run)")
    ap.add_argument("--overlay", action="append", default=[],
                    help="another config overlay after bench/savings.yaml (e.g. bench/savings_methods.yaml)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "savings_summary.csv"))
    args, extra = ap.parse_known_args(argv)
    if not args.summarise_only:
        run_workflow(args.cores, extra, args.overlay, Path(args.run_dir))
    run = Path(args.run_dir)
    table, headline = summarise(run / "results" / "eval" / "comparison.csv")
    cross = crossovers(run / "results" / "eval" / "curves.csv")
    if len(cross):
        summary = cross.groupby(["method", "budget"])["crossover_share_of_m0_budget"].agg(["mean", "std"])
        table = table.merge(summary.rename(columns={"mean": "crossover_share_mean", "std": "crossover_share_std"}),
                            left_on=["method", "budget"], right_index=True, how="left")
    table.to_csv(args.out, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False))
    print(headline)
    return 0



def crossovers(curves_csv: Path) -> pd.DataFrame:
    """Per method, seed and budget: the share of M_0's budget after which M_0's validation loss stays
    below M_1's at equal total FLOPs (M_1's curve shifted by the small models' cost); 1 if M_1 is
    still ahead at the end of M_0's budget, 0 if it is never ahead."""
    import numpy as np

    c = pd.read_csv(curves_csv)
    c = (c[c["run"] == "full"] if "run" in c else c).dropna(subset=["val_loss"])  # whole runs, not branches
    rows = []
    keys = ["method", "seed", "budget"]
    for (method, seed, budget), g in c.groupby(keys):
        m0 = g[g["arm"].str.startswith("M_0")].sort_values("total_flops")
        m1 = g[g["arm"].str.startswith("M_1")].sort_values("total_flops")
        if m0.empty or m1.empty:
            continue
        grid = m0["total_flops"].to_numpy()
        inside = (grid >= m1["total_flops"].min()) & (grid <= m1["total_flops"].max())
        m1_at = np.interp(grid, m1["total_flops"], m1["val_loss"])
        ahead = inside & (m1_at < m0["val_loss"].to_numpy())
        if not ahead.any():
            share = 0.0
        elif ahead[-1]:
            share = 1.0
        else:
            last_ahead = np.nonzero(ahead)[0].max()
            share = float(grid[last_ahead + 1] / grid[-1])
        rows.append({"method": method, "seed": seed, "budget": budget, "crossover_share_of_m0_budget": share})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    raise SystemExit(main())
