"""The scaling benchmark: does "growing pays" hold as the model grows?

M_0 from scratch against msg (the best single-member method) and the best multi-member method
(`bench/scaling.yaml`), at d1 = 64, 128 and 256 with d0 = d1 / 2, L0 = 2, L1 = 4, n = 2, 3 seeds.
Token budgets are in proportion to the parameters: every model, member or large, trains on
`--tokens-per-param` tokens per parameter (0.5 by default: 170k tokens for M_0 at d1 = 64, 1.86M at
d1 = 256; the members' budgets follow from their own size: 48k to 338k), with warm-ups (10% of
M_0's and the members' steps, 5% of the refinement's) and evaluations (every 2.5%) in the same
proportions. Each large arm is trained at three peak
learning rates per size (four at d1 = 256) and compared at its own best one. Each size is one run of the real workflow
in the same folder (`bench/run_scaling/`: the corpus and tokenizer are shared), with an overlay this
script writes there; each size's comparison is copied to `bench/results/scaling_d<d1>.csv` and the mean final
loss of every arm at every rate to `scaling_d<d1>_lr_sweep.csv`.

Prints one row per (d1, method) - seeds, how many reached M_0's final validation loss, the cost
ratio (members counted) and its spread, the same with the members free, the learning rates chosen -
writes `bench/results/scaling_summary.csv` and the plot `bench/results/scaling.svg`, and ends with
`trend: ...`, the counted cost ratio of each method at each size.

    .venv/bin/python bench/scaling.py                    # about 5 hours on 2 cores
    .venv/bin/python bench/scaling.py --sizes 64 128     # the two small points (about an hour)
    .venv/bin/python bench/scaling.py --sizes 256 --tokens-per-param 0.125   # d1 = 256 at a quarter budget
    .venv/bin/python bench/scaling.py --summarise-only
    .venv/bin/python bench/scaling.py --overlay my.yaml  # e.g. another multi-member method (added jobs only)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

from growlm.report import scaling_plot  # noqa: E402
from growlm.shape import ModelShape  # noqa: E402

RUN = REPO / "bench" / "run_scaling"
RESULTS = REPO / "bench" / "results"
L0, L1 = 2, 4
# peak learning rates of the large arms per d1 (a factor of 2 apart; at d1 = 128 a first sweep of 1e-3 to 4e-3 put
# every arm's best at its top; at d1 = 256 M_0's best of 2e-3 to 8e-3 was its bottom, so 1e-3 joins), and the
# members' rate per d0
LRS = {64: [2.0e-3, 4.0e-3, 8.0e-3], 128: [2.0e-3, 4.0e-3, 8.0e-3], 256: [1.0e-3, 2.0e-3, 4.0e-3, 8.0e-3]}
MEMBER_LR = {32: 3.0e-3, 64: 2.0e-3, 128: 1.5e-3}
# arms left out at a size, to keep it within a few hours on 2 cores: at d1 = 256, concat + zero_block (the
# multi-member arm of the first round, behind msg_members in bench/RESULTS.md section 5)
SKIPPED = {256: [["concat", "zero_block"]]}


def params(d: int, layers: int, vocab: int, context: int) -> int:
    return ModelShape(n_embd=d, n_layer=layers, n_head=d // 16, vocab_size=vocab, n_positions=context).n_params


def point(d1: int, tokens_per_param: float, base: dict) -> dict:
    """The overlay of one size."""
    vocab, context = base["tokenizer"]["vocab_size"], base["model"]["context"]
    d0 = d1 // 2
    batch = base["train"]["large"]["batch_size"] * context
    budget = int(round(tokens_per_param * params(d1, L1, vocab, context) / 1000) * 1000)
    small = int(round(tokens_per_param * params(d0, L0, vocab, context) / 1000) * 1000)
    steps, small_steps = budget // batch, small // batch
    # warm-ups and evaluations as shares of each run, so that every size sees the same schedule shape
    methods = [m for m in base["methods"] if m not in SKIPPED.get(d1, [])]
    return {"d0": [d0], "L0": [L0], "d1": [d1], "L1": [L1], "budgets": [budget], "lrs": LRS[d1], "methods": methods,
            "train": {"small": {"tokens": small, "lr": MEMBER_LR[d0], "warmup_steps": max(2, small_steps // 10)},
                      "large": {"warmup_steps": max(5, steps // 10)},
                      "refine": {"warmup_steps": max(3, steps // 20)},
                      "eval_interval": max(4, steps // 40)}}


def run_point(d1: int, overlay: dict, cores: int, extra: list[str], overlays: list[str]) -> Path:
    RUN.mkdir(parents=True, exist_ok=True)
    size_file = RUN / f"size_d{d1}.yaml"
    size_file.write_text(yaml.safe_dump(overlay, sort_keys=False))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "--directory", str(RUN),
           "--configfile", str(REPO / "config" / "config.yaml"), str(REPO / "bench" / "scaling.yaml"),
           *[str(Path(o).resolve()) for o in overlays], str(size_file), "--cores", str(cores),
           "--workflow-profile", "none", *extra]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    out = RESULTS / f"scaling_d{d1}.csv"
    shutil.copy(RUN / "results" / "eval" / "comparison.csv", out)
    shutil.copy(RUN / "results" / "eval" / "lr_sweep.csv", RESULTS / f"scaling_d{d1}_lr_sweep.csv")  # every rate
    return out


def summarise(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, str]:
    df = pd.concat(frames, ignore_index=True)
    df["reached"] = df["reached"].astype(str).str.lower().isin(["true", "1"])
    table = (df.groupby(["d1", "method"], sort=True)
             .agg(d0=("d0", "first"), budget=("budget", "first"), seeds=("seed", "nunique"),
                  reached=("reached", "sum"), m0_lr=("m0_lr", "first"), m1_lr=("m1_lr", "first"),
                  cost_ratio_mean=("cost_ratio", "mean"), cost_ratio_std=("cost_ratio", "std"),
                  cost_ratio_small_free_mean=("cost_ratio_small_free", "mean"),
                  cost_ratio_small_free_std=("cost_ratio_small_free", "std"),
                  wall_ratio_mean=("wall_ratio", "mean"),
                  m0_final_val_loss=("m0_final_val_loss", "mean"), m1_final_val_loss=("m1_final_val_loss", "mean"),
                  loss_gap_equal_flops_mean=("loss_gap_equal_flops", "mean"))
             .reset_index())
    trend = "; ".join(
        f"{method}: " + ", ".join(f"d1={int(r.d1)} {r.cost_ratio_mean:.3f}" + ("" if r.reached == r.seeds else
                                                                                 f" ({int(r.reached)}/{int(r.seeds)} reached)")
                                  for r in g.itertuples())
        for method, g in table.groupby("method", sort=False))
    return table, f"trend: {trend}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256], choices=sorted(LRS))
    ap.add_argument("--tokens-per-param", type=float, default=0.5)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--overlay", action="append", default=[], help="another config overlay after bench/scaling.yaml")
    ap.add_argument("--summarise-only", action="store_true")
    args, extra = ap.parse_known_args(argv)
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    shared = yaml.safe_load((REPO / "bench" / "scaling.yaml").read_text())
    for key in ("tokenizer", "model", "train"):
        base[key] = {**base[key], **shared.get(key, {})}
    base["methods"] = shared["methods"]
    for overlay in args.overlay:  # the last overlay that names methods wins, as in Snakemake's config merge
        base["methods"] = (yaml.safe_load(Path(overlay).read_text()) or {}).get("methods", base["methods"])
    base["train"]["large"] = {**yaml.safe_load((REPO / "config" / "config.yaml").read_text())["train"]["large"],
                              **shared["train"]["large"]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    frames = []
    for d1 in args.sizes:
        if not args.summarise_only:
            run_point(d1, point(d1, args.tokens_per_param, base), args.cores, extra, args.overlay)
        frames.append(pd.read_csv(RESULTS / f"scaling_d{d1}.csv"))
    table, trend = summarise(frames)
    table.to_csv(RESULTS / "scaling_summary.csv", index=False)
    scaling_plot(pd.concat(frames, ignore_index=True), RESULTS / "scaling.svg")
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print(table.to_string(index=False))
    print(trend)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
