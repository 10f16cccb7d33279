"""Does the answer depend on the model family? The default experiment in GPT-2 and in Llama, 3 seeds.

Runs the workflow twice in its own folders (bench/run_families/gpt2, bench/run_families/llama), each
with config/config.yaml (plus config/llama.yaml for Llama) and seeds 0, 1, 2, and summarises each
comparison.csv as bench/savings.py does: per family and method, how many seeds reached M_0's final
validation loss, the cost ratio with the members counted and free (mean and standard deviation over
the seeds that reached it), and the final losses.

    .venv/bin/python bench/families.py                      # about 1.5 hours a family on 2 cores
    .venv/bin/python bench/families.py --summarise-only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "bench" / "run_families"
FAMILIES = {"gpt2": [], "llama": [str(REPO / "config" / "llama.yaml")]}


def run(family: str, cores: int, extra: list[str]) -> None:
    wd = RUN / family
    wd.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "--directory", str(wd),
           "--configfile", str(REPO / "config" / "config.yaml"), *FAMILIES[family], "--config", "seeds=[0,1,2]",
           "experiment=default", "profile={tools: []}", "--cores", str(cores), "--workflow-profile", "none", *extra]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def summary(family: str) -> pd.DataFrame:
    df = pd.read_csv(RUN / family / "results" / "eval" / "comparison.csv")
    df["reached"] = df["cost_ratio"].notna()
    out = df.groupby("method").agg(seeds=("seed", "nunique"), reached=("reached", "sum"),
                                   cost_ratio=("cost_ratio", "mean"), cost_ratio_std=("cost_ratio", "std"),
                                   small_free=("cost_ratio_small_free", "mean"),
                                   small_free_std=("cost_ratio_small_free", "std"),
                                   m0_final=("m0_final_val_loss", "mean"), m1_final=("m1_final_val_loss", "mean"),
                                   m1_final_std=("m1_final_val_loss", "std")).reset_index()
    out.insert(0, "family", family)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--summarise-only", action="store_true")
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES), help="default: both")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "families_summary.csv"))
    args, extra = ap.parse_known_args(argv)
    families = args.family or list(FAMILIES)
    if not args.summarise_only:
        for family in families:
            run(family, args.cores, extra)
    table = pd.concat([summary(f) for f in families if (RUN / f / "results" / "eval" / "comparison.csv").is_file()])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
