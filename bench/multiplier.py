"""The effective compute multiplier with its 95% interval at 8 and 32 tokens per parameter (RESULTS 15, measured again).

    .venv/bin/python bench/multiplier.py --budgets 8 --seeds 0,1,2   # trains what is missing, then the tables
    .venv/bin/python bench/multiplier.py --budgets 8 --seeds 3,4     # more seeds where an interval straddles 1
    .venv/bin/python bench/multiplier.py --summarise-only            # the tables from the finished runs

RESULTS 15 read each arm's cost off the lowest loss any of its runs reached, the full run's own decay included, and
divided by M_0's FLOPs to its own final loss; at 32 tokens per parameter that was the first crossing again, and
its differences sat inside the seeds' spread. This measures the same setting as the field reads it (growlm.multiplier,
docs/results.md): M_0's finished runs (its full runs' and cooldown branches' ends, seeds pooled) fitted with
L(C) = E + A C^-alpha, and each arm's effective compute multiplier C_0(L_1) / C_1 with a 95% interval from a
bootstrap over seeds, its members counted and free.

Setting: bench/envelope.yaml (section 8's: bundled readers, vocabulary 2048, members d0 = 32, L0 = 2 on level 0,
M_0 and M_1 d1 = 64, L1 = 4 on level 1, every job under wsd), M_0 at its tuned rate 4e-3 and weight decay 0.1
(RESULTS 15's tuning table: 0.1 ended lowest at both budgets), trained twice its budget (`EXTEND`) with cooldown
branches whose ends bracket the budget, so that M_0's finished runs bracket every arm's final loss and its run of
exactly the budget is one of them; every arm refined at 8e-3 and weight decay 0.1 with cooldown branches at the
refinement's points (`REFINE_POINTS`). Every evaluation's standard error is recorded and every run's end is
evaluated on the whole validation split.

Arms (RESULTS 15's, `bench/envelope.py`'s definitions; `--arms` trains some of them): `msg`, the members given 1% and
10% of M_0's FLOPs, and the 10% member with teaching (the best teach arm at 8 tokens per parameter). Each budget's
folders are run_multiplier_<budget>_<arm folder> under --root; M_0 and `msg` train in the base folder, every other
arm in a copy of it (corpus, tokenizer and M_0 reused).

    .venv/bin/python bench/multiplier.py --budgets 32 --seeds 0,1,2 --arms "msg; msg, members 10%"   # two arms

Writes, leaving RESULTS 15's first measurement (envelope_*.csv) as it was:
- bench/results/multiplier_seeds.csv: growlm's comparison row of every arm and seed (growlm.compare.compare_one),
  with its multiplier columns;
- bench/results/multiplier_table.csv: one row per budget and arm: the multiplier counted and free with its 95%
  interval, whether it is an extrapolation and by how much, the cost ratio by envelope of finished runs and within
  one schedule (mean and standard deviation over seeds), the final losses with their standard errors;
- bench/results/multiplier_paired.csv: each arm and seed's final loss minus M_0's, read again on the same
  validation windows from the kept models, with that difference's standard error (`paired`); each arm's, for its
  seeds' mean, goes into its interval (growlm.multiplier's `eval_se`) and the table's eval_se;
- bench/results/multiplier_curves.csv: every evaluation of every run (M_0's full runs and branches, each M_1's,
  the members'), so that every figure can be fitted again without training.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from envelope import (SIZES, Runner, arms, baseline_dir, compare_in, optim, refined_dir, with_teach,
                      write_seeds_and_curves)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

OUT = REPO / "bench" / "results"
BUDGETS = {"8": 1_600_000, "32": 6_400_000}
M0_LR, ARM_LR, WD = "0.004", "0.008", 0.1
ARMS = ("msg", "msg, members 1%", "msg, members 10%", "msg, members 10% + teach")
EXTEND = 2  # M_0 trains twice its budget (baseline.extend)
# M_0's branches: train.branches' default points (0.2, 0.35, 0.5, 0.7 of the stable phase of its run of the budget),
# and the two baseline.extend adds, 1 (the run of exactly the budget) and (1 + EXTEND) / 2; so its finished runs end at
# about 0.2, 0.35, 0.5, 0.7, 1, 1.5 and 2 times the budget
M0_POINTS = (0.2, 0.35, 0.5, 0.7, 1.0, (1 + EXTEND) / 2)
# The refinements' branch points, train.refine.branches' defaults, which add 0.85 and 0.95 to RESULTS 15's four
REFINE_POINTS = (0.2, 0.35, 0.5, 0.7, 0.85, 0.95)


def overlay() -> dict:
    """What every folder adds to envelope.yaml: M_0 past its budget (its branch points follow), the refinements'
    branch points as the defaults give them."""
    return {"baseline": {"extend": EXTEND}}


def all_arms(key: str, names=ARMS) -> dict[str, dict]:
    """The arms `names` (bench/envelope.py's definitions, `+ teach` with teaching) at budget `key`."""
    budget = BUDGETS[key]
    out = arms(budget)
    for name in list(out):
        out[f"{name} + teach"] = with_teach(out[name])
    return {name: out[name] for name in names}


def point_ids(points) -> list[str]:
    from growlm.envelope import point_id

    return [point_id(p) for p in points]


def targets(model: str, points) -> list[str]:
    """A large model's test metrics and its cooldown branches' records (its ledger comes with them). Not the ledger
    itself: it is an output of the training job beside the branch points' states, which are temporary (each
    branch's job deletes its start once it has run), so asking for the ledger of a finished model would train the
    model again to make those states, where asking for what was made from them finds everything done."""
    return [model.replace("models/", "eval/", 1) + "/metrics.json",
            *(f"{model}/branches/b{p}/branch.json" for p in point_ids(points))]


def m0_model(budget: int, seed: int) -> str:
    return baseline_dir(budget, optim(M0_LR, WD), seed)


def m1_model(arm: dict, budget: int, seed: int) -> str:
    return refined_dir(arm, budget, optim(ARM_LR, WD), seed)


def run(root: Path, key: str, seeds, cores: int, names=ARMS) -> None:
    """Every model of a budget's arms `names` at `seeds` that is not finished: the base folder (M_0 always, msg
    where named) first, then the other arms' folders side by side, each on one core."""
    budget = BUDGETS[key]
    r = Runner(root, budget, cores)
    r.folder = lambda name: root / f"run_multiplier_{budget}_{name}"  # this measurement's own folders
    chosen = all_arms(key, ("msg", *(n for n in names if n != "msg")))
    base = [t for s in seeds for t in targets(m0_model(budget, s), M0_POINTS)]
    if "msg" in names:
        base += [t for s in seeds for t in targets(m1_model(chosen["msg"], budget, s), REFINE_POINTS)]
    r.run("base", overlay(), base, copy_of=None)
    others: dict[str, tuple[dict, list[str]]] = {}
    for name, arm in chosen.items():
        if arm["folder"] == "base":
            continue
        settings, wanted = others.setdefault(arm["folder"], (_merge(arm["overlay"]), []))
        wanted += [t for s in seeds for t in targets(m1_model(arm, budget, s), REFINE_POINTS)]
    one = Runner(root, budget, 1)
    one.folder = r.folder
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=cores) as pool:
        for done in [pool.submit(one.run, folder, settings, wanted) for folder, (settings, wanted) in others.items()]:
            done.result()


def _merge(arm_overlay: dict) -> dict:
    """An arm's overlay with this measurement's beside it."""
    return {**arm_overlay, **overlay()}


def finished(root: Path, key: str, arm: dict, seed: int) -> bool:
    """Whether M_0 and the arm's M_1 at `seed` have finished every run and evaluation."""
    budget = BUDGETS[key]
    base, folder = root / f"run_multiplier_{budget}_base", root / f"run_multiplier_{budget}_{arm['folder']}"
    wanted = [base / t for t in targets(m0_model(budget, seed), M0_POINTS)]
    wanted += [folder / t for t in targets(m1_model(arm, budget, seed), REFINE_POINTS)]
    return all(f.is_file() for f in wanted)


def paired(root: Path, keys, seeds=range(10)) -> tuple[pd.DataFrame, dict]:
    """The evaluation's error in each comparison: every finished arm and seed's final loss minus M_0's, read on
    the same validation windows, with that difference's standard error (growlm.loss.window_losses, mean_and_se
    of the windows' differences), in which what every model finds hard in those windows cancels; and per arm
    the same for the seeds' mean difference, {(budget, arm): (standard error, windows)}, the error the seeds
    share that growlm.multiplier carries into the interval (`eval_se`).

    M_0 here is its run to `EXTEND` times the budget, the one whose weights a run keeps (its branches keep their
    ledgers only), so the difference is not the one the multiplier reads; its error is the evaluation's for two
    models of this size on these windows, further apart than M_1 is from M_0's curve (a closer pair shares more),
    so an upper bound of it. Each model's loss read here is checked against the one its own run recorded; the
    windows' losses are kept under root/window_losses by the model's checksum. Writes
    bench/results/multiplier_paired.csv."""
    import json

    import numpy as np

    from growlm.loss import mean_and_se, window_losses
    from growlm.model import load_model
    from growlm.runs import eval_error

    cache = root / "window_losses"
    cache.mkdir(exist_ok=True)

    def sums(model_dir: Path, val: np.ndarray) -> np.ndarray:
        record = json.loads((model_dir / "growlm.json").read_text())["train"]
        kept = cache / f"{(model_dir / 'model.safetensors.sha256').read_text().split()[0]}.npy"
        if kept.is_file():
            out = np.load(kept)
        else:
            out = window_losses(load_model(model_dir), val, context=record["config"]["context"])
            np.save(kept, out)
        loss = out.sum() / (out.size * record["config"]["context"])
        if abs(loss - record["final_val_loss"]) > 1e-4:
            raise SystemExit(f"{model_dir}: its final loss read again is {loss:.5f}, its run recorded "
                             f"{record['final_val_loss']:.5f}; not the same windows or not the same model")
        return out

    rows, per_arm_se = [], {}
    for key in keys:
        budget = BUDGETS[key]
        base = root / f"run_multiplier_{budget}_base"
        if not (base / "results/tokens/level1/val.npy").is_file():
            continue
        val = np.load(base / "results/tokens/level1/val.npy")
        for name, arm in all_arms(key).items():
            folder = root / f"run_multiplier_{budget}_{arm['folder']}"
            differences = []
            for seed in seeds:
                if not finished(root, key, arm, seed):
                    continue
                m0_dir, m1_dir = base / m0_model(budget, seed), folder / m1_model(arm, budget, seed)
                s0, s1 = sums(m0_dir, val), sums(m1_dir, val)
                context = json.loads((m1_dir / "growlm.json").read_text())["train"]["config"]["context"]
                counts = np.full(s1.size, context)
                (l0, se0), (l1, se1) = mean_and_se(s0, counts), mean_and_se(s1, counts)
                difference, paired_se = mean_and_se(s1 - s0, counts)
                differences.append((s1 - s0) / context)  # per window's mean, as growlm.runs.eval_error reads them
                rows.append({"budget": budget, "arm": name, "seed": seed, "windows": s1.size,
                             "tokens": int(counts.sum()), "m0_tokens_trained": EXTEND * budget,
                             "m0_loss": l0, "m0_loss_se": se0, "m1_loss": l1, "m1_loss_se": se1,
                             "m1_minus_m0": difference, "m1_minus_m0_se": paired_se})
            if differences:
                per_arm_se[(budget, name)] = eval_error(differences)
    out = pd.DataFrame(rows)
    if len(out):
        out.to_csv(OUT / "multiplier_paired.csv", index=False)
    return out, per_arm_se


def arm_rows(root: Path, key: str, name: str, arm: dict, seeds) -> tuple[list[dict], list[pd.DataFrame], list]:
    """Each seed's comparison row of an arm against M_0 (base folder), its curves and M_0's finished runs."""
    from growlm.runs import arm_ends

    budget = BUDGETS[key]
    folder = root / f"run_multiplier_{budget}_{arm['folder']}"
    base = root / f"run_multiplier_{budget}_base"
    rows, curves, ends = [], [], []
    for seed in seeds:
        if not finished(root, key, arm, seed):  # a seed not finished (every run and evaluation) is left out
            continue
        m0, m1 = base / m0_model(budget, seed), folder / m1_model(arm, budget, seed)
        combo = {"d0": arm["d0"], "L0": arm["L0"], "d1": SIZES["d1"], "L1": SIZES["L1"], "n": arm["n"],
                 "method": arm["method"], "seed": seed, "budget": budget, "lr": optim(ARM_LR, WD)}
        paths = {"baseline": str(base / "results/models/baseline/d{d1}_L{L1}/t{budget}_lr{lr}/s{seed}"),
                 "refined": str(folder / "results/models/refined/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/"
                                         "t{budget}_lr{lr}/s{seed}"),
                 "grown": str(folder / "results/models/grown/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/s{seed}")}
        tokens = {"large": folder / "results/tokens/level1/train.npy",
                  "members": folder / "results/tokens/level0/train.npy"}
        points = {"baseline": point_ids(M0_POINTS), "refine": point_ids(REFINE_POINTS)}
        row, c = compare_in(folder, combo, paths, m0_lr=optim(M0_LR, WD), envelope_dirs={"m0": [m0], "m1": [m1]},
                            branches=points, token_files=tokens)
        rows.append({"arm": name, **row})
        curves += [x.assign(arm_name=name) for x in c]
        ends.append(arm_ends([m0], points["baseline"]).assign(
            **{k: combo[k] for k in ("method", "d0", "L0", "d1", "L1", "n", "budget")}, seed=seed))
    return rows, curves, ends


def summarise(root: Path, keys, seeds=range(10)) -> pd.DataFrame:
    from growlm.runs import multiplier_columns

    seeds_rows, curves = [], []
    _, evaluation = paired(root, keys, seeds)
    for key in keys:
        for name, arm in all_arms(key).items():
            rows, c, ends = arm_rows(root, key, name, arm, seeds)
            if not rows:
                continue
            se, windows = evaluation.get((BUDGETS[key], name), (float("nan"), 0))
            rows = [{**r, "eval_se": se, "eval_windows": windows} for r in rows]
            table = multiplier_columns(pd.DataFrame(rows), pd.concat(ends, ignore_index=True))
            seeds_rows.append(table)
            curves += c
    per_seed = write_seeds_and_curves(seeds_rows, curves, "multiplier",
                                      ["arm", "run", "seed", "budget", "method", "arm_name"], root, OUT)
    if per_seed is None:
        return pd.DataFrame()
    table = per_arm(per_seed)
    table.to_csv(OUT / "multiplier_table.csv", index=False)
    return table


def per_arm(per_seed: pd.DataFrame) -> pd.DataFrame:
    """One row per budget and arm: the arm's multiplier columns (the same on each of its seeds' rows), the cost
    ratios' means and standard deviations over the seeds, the final losses' means and standard errors."""
    g = per_seed.groupby(["budget", "arm"], sort=False)
    first = ["tokens_per_param", "m0_passes", "multiplier", "multiplier_low", "multiplier_high", "multiplier_free",
             "multiplier_free_low", "multiplier_free_high", "saving", "extrapolated", "extrapolation_factor",
             "m0_fit_E", "m0_fit_A", "m0_fit_alpha", "m0_points", "m0_seeds", "m1_seeds", "interval_method",
             "members_passes", "eval_se", "eval_windows"]
    table = g.agg(**{c: (c, "first") for c in first if c in per_seed},
                  seeds=("seed", "nunique"),
                  small_flops=("small_flops", "first"), m0_flops=("m0_flops", "first"),
                  reached_by_envelope=("envelope_reached", "sum"), reached_within=("reached", "sum"),
                  envelope_ratio=("envelope_ratio", "mean"), envelope_ratio_std=("envelope_ratio", "std"),
                  envelope_ratio_small_free=("envelope_ratio_small_free", "mean"),
                  cost_ratio=("cost_ratio", "mean"), cost_ratio_std=("cost_ratio", "std"),
                  cost_ratio_small_free=("cost_ratio_small_free", "mean"),
                  m0_final_val_loss=("m0_final_val_loss", "mean"), m0_final_val_loss_std=("m0_final_val_loss", "std"),
                  m0_final_val_loss_se=("m0_final_val_loss_se", "mean"),
                  m1_final_val_loss=("m1_final_val_loss", "mean"), m1_final_val_loss_std=("m1_final_val_loss", "std"),
                  m1_final_val_loss_se=("m1_final_val_loss_se", "mean"),
                  cooldown_flops=("cooldown_flops", "mean")).reset_index()
    table["small_flops_share"] = table.pop("small_flops") / table["m0_flops"]
    table["cooldowns_share_of_m0"] = table.pop("cooldown_flops") / table.pop("m0_flops")
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--root", type=Path, default=REPO / "bench", help="where the run folders go")
    ap.add_argument("--budgets", default="8,32", help="tokens per non-embedding parameter: 8, 32 or both")
    ap.add_argument("--seeds", default="0,1,2", help="seeds to train (the tables read every seed finished)")
    ap.add_argument("--arms", default=";".join(ARMS),
                    help="arms to train, separated by ';' (M_0 is always trained: the others start from a copy of its folder)")
    ap.add_argument("--summarise-only", action="store_true")
    args = ap.parse_args(argv)
    keys = [k for k in args.budgets.split(",") if k]
    unknown = [k for k in keys if k not in BUDGETS]
    if unknown:
        ap.error(f"unknown budgets {unknown}; one of {sorted(BUDGETS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s != ""]
    except ValueError:
        ap.error(f"--seeds takes whole numbers separated by commas, not {args.seeds!r}")
    names = [n.strip() for n in args.arms.split(";") if n.strip()]
    if not set(names) <= set(ARMS):
        ap.error(f"unknown arms {sorted(set(names) - set(ARMS))}; any of {list(ARMS)}, separated by ';'")
    if not args.summarise_only:
        for key in keys:
            run(args.root, key, seeds, args.cores, names)
            summarise(args.root, keys)
    table = summarise(args.root, keys)
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
