"""Cost by envelope at realistic budgets: the levers that keep growth paying, against a tuned M_0 (RESULTS 15).

    .venv/bin/python bench/envelope.py                    # every phase (hours on 2 cores), then the table
    .venv/bin/python bench/envelope.py --budgets 32       # 32 tokens per non-embedding parameter only
    .venv/bin/python bench/envelope.py --summarise-only   # the table from the finished runs

Setting: bench/envelope.yaml (section 8's: bundled readers, vocabulary 2048, members d0 = 32, L0 = 2 on level 0,
M_0 and M_1 d1 = 64, L1 = 4 on level 1), every job under warmup-stable-decay with cooldown branches at 0.2, 0.35,
0.5 and 0.7 of every large job's stable phase, at M_0's budgets of 6.4M and 1.6M tokens (32.6 and 8.1 tokens per
non-embedding parameter of M_0). Each budget runs in phases, each a workflow run with explicit targets in a folder
of its own under --root (default bench/), the later ones starting as copies of the first (so that M_0 is trained
once):

1. `tune` (run_envelope_<budget>_base): M_0 at the peak rate 4e-3 (its best under wsd, section 14) and weight
   decays 0.1, 0.3 and 1.0, seed 0 (and 3.0 where 1.0 wins); M_0's weight decay is the one with the lowest final
   validation loss.
2. `arms` (seed 0), each refined at 8e-3 (the arms' best under wsd, section 14), at weight decay 0.1 and at M_0's
   chosen one; the arms' weight decay is the one `msg` ends lower with (applied to every arm):
   - `msg`: members trained 150k tokens, grown annealed, refined with a 5-step re-warm-up (base folder);
   - `msg_members + carry`: both such members (base folder);
   - `msg, members x%` for x = 1, 3, 10: one member given x% of M_0's FLOPs (`members.flops_share`), grown where its
     decay began (`members.source: before_decay`), M_1 continuing at its peak rate (`train.refine.warmup_steps: 0`);
   - `G_stack 2x depth`: one member d0 = d1 = 64, L0 = 2 at 3% of M_0's FLOPs, before its decay, stacked to 4 layers
     (`stack`), continuing;
3. `teach` (seed 0): the arm with the lowest cost ratio by envelope with the members' teaching fading to zero over
   the first tenth of the refinement (`teach`, `teach_steps: 0.1`);
4. `seeds` 1 and 2: M_0 at its chosen weight decay, `msg`, the best `members x%` and the teach arm (the other arms
   have seed 0 only, to fit the time).

At 32 tokens per parameter the large models read level 1's training text 12.5 times. A last phase, `passes`, trains
the large models on the training text of both levels (`levels.large: [0, 1]`) for 3 passes, seed 0: M_0 at weight
decays 0.1 and 0.3, `msg` and the best `members x%`.

Rows come from growlm's own comparison (`growlm.compare.compare_one`, with every arm's cooldown branches): the table
(bench/results/envelope_table.csv, per seed in envelope_seeds.csv) gives per budget and arm the seeds, the cost
ratio by envelope and within one schedule, members counted and free (mean and standard deviation over the seeds),
the final losses, the cooldowns' own FLOPs as a share of M_0's, and the passes over the large arms' and the
members' text.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

OVERLAY = REPO / "bench" / "envelope.yaml"
BUDGETS = {"32": 6_400_000, "8": 1_600_000}
SIZES = {"d0": 32, "L0": 2, "d1": 64, "L1": 4}
M0_LR, ARM_LR = "0.004", "0.008"
WDS = (0.1, 0.3, 1.0)
SHARES = (0.01, 0.03, 0.10)
POINTS = ("20", "35", "50", "70")
TEACH_SHARE = 0.1
OUT = REPO / "bench" / "results"


def optim(lr: str, wd: float) -> str:
    from growlm.experiment import optim_id

    return optim_id(lr, wd, 0.1)


def baseline_dir(budget: int, lr: str, seed: int) -> str:
    return f"results/models/baseline/d{SIZES['d1']}_L{SIZES['L1']}/t{budget}_lr{lr}/s{seed}"


def refined_dir(arm: dict, budget: int, lr: str, seed: int) -> str:
    return (f"results/models/refined/{arm['method']}/d{arm['d0']}_L{arm['L0']}_to_d{SIZES['d1']}_L{SIZES['L1']}/"
            f"n{arm['n']}/t{budget}_lr{lr}/s{seed}")


def model_targets(model: str) -> list[str]:
    """A large model's metrics and its cooldown branches' records."""
    return [model.replace("models/", "eval/", 1) + "/metrics.json",
            *(f"{model}/branches/b{p}/branch.json" for p in POINTS)]


def arms(budget: int) -> dict[str, dict]:
    """Every arm of phase 2: its folder, its overlay (beside envelope.yaml and the budget) and its chain id."""
    base = {"d0": SIZES["d0"], "L0": SIZES["L0"], "n": 2, "folder": "base", "overlay": {}}
    out = {"msg": {**base, "method": "msg"},
           "msg_members + carry": {**base, "method": "msg_members+carry"}}
    for share in SHARES:
        out[f"msg, members {share:.0%}"] = {
            "d0": SIZES["d0"], "L0": SIZES["L0"], "n": 1, "method": "msg", "folder": f"share{share:g}",
            "overlay": {"n": [1], "methods": [["msg"]], "members": {"flops_share": share, "source": "before_decay"},
                        "train": {"refine": {"warmup_steps": 0}}}}
    out["G_stack 2x depth, member 3%"] = {
        "d0": SIZES["d1"], "L0": SIZES["L1"] // 2, "n": 1, "method": "stack", "folder": "gstack",
        "overlay": {"d0": [SIZES["d1"]], "L0": [SIZES["L1"] // 2], "n": [1], "methods": [["stack"]],
                    "members": {"flops_share": 0.03, "source": "before_decay"},
                    "train": {"refine": {"warmup_steps": 0}}}}
    return out


def with_teach(arm: dict) -> dict:
    chain = arm["method"].split("+")
    overlay = json.loads(json.dumps(arm["overlay"]))
    overlay["methods"] = [[*chain, "teach"]]
    overlay.setdefault("grow", {"options": {"msg": {"ramp_steps": 40}, "msg_members": {"ramp_steps": 40}}})
    overlay["grow"]["options"]["teach"] = {"teach_steps": TEACH_SHARE}
    return {**arm, "method": "+".join([*chain, "teach"]), "folder": arm["folder"] + "_teach", "overlay": overlay}


class Runner:
    def __init__(self, root: Path, budget: int, cores: int):
        self.root, self.budget, self.cores = root, budget, cores

    def folder(self, name: str) -> Path:
        return self.root / f"run_envelope_{self.budget}_{name}"

    def run(self, name: str, overlay: dict, targets: list[str], copy_of: str | None = "base") -> None:
        """The workflow in folder `name` (a copy of `copy_of`'s without its growth and refinements, so that its
        corpus, tokenizer and M_0 are reused, and its members where this run's are the same: Snakemake reruns
        those whose settings differ), with envelope.yaml, the budget and `overlay`, for `targets`."""
        run = self.folder(name)
        if copy_of is not None and name != copy_of and not run.exists():
            shutil.copytree(self.folder(copy_of), run, symlinks=True,
                            ignore=shutil.ignore_patterns("locks", "incomplete", "grown", "refined"))
        run.mkdir(parents=True, exist_ok=True)
        (run / "budget.yaml").write_text(f"budgets: [{self.budget}]\n")
        (run / "arm.yaml").write_text(json.dumps(overlay) + "\n")
        cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "--directory", str(run),
               "--configfile", str(REPO / "config" / "config.yaml"), str(OVERLAY), "budget.yaml", "arm.yaml",
               "--cores", str(self.cores), "--workflow-profile", "none", "--keep-going", "--rerun-incomplete",
               *targets]
        print(f"[{self.budget} {name}] {' '.join(cmd)}", flush=True)
        subprocess.run(cmd, check=True, cwd=run)


    def run_many(self, runs: dict[str, tuple[dict, list[str]]]) -> None:
        """`run` for every {folder: (overlay, targets)}, `cores` of them at a time, each on one core."""
        from concurrent.futures import ThreadPoolExecutor

        one = Runner(self.root, self.budget, 1)
        with ThreadPoolExecutor(max_workers=self.cores) as pool:
            for done in [pool.submit(one.run, folder, overlay, targets) for folder, (overlay, targets) in runs.items()]:
                done.result()


def compare_in(run: Path, combo: dict, paths: dict, **kwargs) -> tuple[dict, list]:
    """growlm.compare.compare_one from inside the run's folder (the grow job's record names the members relative to
    it, as the workflow runs): its row, without the savings column and with compare's own words for the arm
    ("grown from m_1 ...") as `arm_kind`, and its curves. bench/multiplier.py and bench/ladder.py read their arms so."""
    from growlm.compare import compare_one

    here = os.getcwd()
    os.chdir(run)
    try:
        row, curves = compare_one(combo, paths, **kwargs)
    finally:
        os.chdir(here)
    row.pop("savings", None)
    row["arm_kind"] = row.pop("arm")
    return row, curves


def write_seeds_and_curves(per_seed: list, curves: list, name: str, keys: list[str], root: Path,
                           out: Path) -> pd.DataFrame | None:
    """A bench's rows per arm and seed (`per_seed`, frames with the multiplier columns) and every evaluation of
    every run (`curves`, with total_flops = flops + offset_flops, one row per `keys` and step) to
    out/<name>_seeds.csv and out/<name>_curves.csv; the seeds' rows, or None (said) where no run has finished."""
    if not per_seed:
        print("no finished runs under", root)
        return None
    seeds_df = pd.concat(per_seed, ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    seeds_df.to_csv(out / f"{name}_seeds.csv", index=False)
    curve_df = pd.concat(curves, ignore_index=True)
    curve_df["total_flops"] = curve_df["flops"] + curve_df["offset_flops"]
    curve_df.drop_duplicates(subset=[*keys, "step"]).to_csv(out / f"{name}_curves.csv", index=False)
    return seeds_df


def final_loss(run: Path, model: str) -> float:
    from growlm.compare import final_val_loss

    return final_val_loss(run / model)


def tune(r: Runner, seeds=(0,)) -> float:
    """Phase 1: M_0's weight decay (seed 0), extended by x3 while the largest tried wins (once)."""
    wds = list(WDS)
    while True:
        r.run("base", {}, [t for wd in wds for s in seeds for t in model_targets(baseline_dir(r.budget, optim(M0_LR, wd), s))],
              copy_of=None)
        losses = {wd: final_loss(r.folder("base"), baseline_dir(r.budget, optim(M0_LR, wd), 0)) for wd in wds}
        best = min(losses, key=losses.get)
        if best != max(wds) or len(wds) > len(WDS):
            return best
        wds.append(round(max(wds) * 3, 6))


def arm_targets(r: Runner, arm: dict, wds, seeds) -> list[str]:
    return [t for wd in wds for s in seeds for t in model_targets(refined_dir(arm, r.budget, optim(ARM_LR, wd), s))]


def m0_targets(r: Runner, wd: float, seeds) -> list[str]:
    return [t for s in seeds for t in model_targets(baseline_dir(r.budget, optim(M0_LR, wd), s))]


def choose(r: Runner) -> dict:
    """Phases 1-3 at seed 0: M_0's weight decay, the arms' weight decay (on msg), every arm, the teach arm."""
    state_file = r.root / f"run_envelope_{r.budget}_choices.json"
    m0_wd = tune(r)
    all_arms = arms(r.budget)
    msg = all_arms["msg"]
    wds = sorted({0.1, m0_wd})
    r.run("base", {}, arm_targets(r, msg, wds, (0,)) + m0_targets(r, m0_wd, (0,)), copy_of=None)
    arm_wd = min(wds, key=lambda wd: final_loss(r.folder("base"), refined_dir(msg, r.budget, optim(ARM_LR, wd), 0)))
    # every arm's folder at once, two at a time on one core each (a refinement is one job: a second core would
    # idle); the base folder's arms in one run. M_0 is base's (arm_rows): no arm's folder trains it again.
    runs: dict[str, tuple[dict, list[str]]] = {}
    for arm in all_arms.values():
        overlay, targets = runs.setdefault(arm["folder"], (arm["overlay"], []))
        targets += arm_targets(r, arm, [arm_wd], (0,))
    r.run_many({folder: (overlay, targets) for folder, (overlay, targets) in runs.items()})
    rows = [row for name, arm in all_arms.items() for row in arm_rows(r, name, arm, m0_wd, arm_wd, (0,))]
    ranked = sorted((row for row in rows if row["envelope_ratio"] == row["envelope_ratio"]),
                    key=lambda row: row["envelope_ratio"])
    best = ranked[0]["arm"] if ranked else "msg"
    teach = with_teach(all_arms[best])
    r.run(teach["folder"], teach["overlay"], arm_targets(r, teach, [arm_wd], (0,)), copy_of=all_arms[best]["folder"])
    shares = [n for n in all_arms if n.startswith("msg, members")]
    best_share = min(shares, key=lambda n: next((row["envelope_ratio"] for row in rows if row["arm"] == n), 9.0))
    choices = {"m0_wd": m0_wd, "arm_wd": arm_wd, "best": best, "best_share": best_share, "teach": f"{best} + teach"}
    state_file.write_text(json.dumps(choices, indent=1))
    return choices


def more_seeds(r: Runner, choices: dict, seeds=(1, 2)) -> None:
    """Phase 4: seeds 1 and 2 of M_0, msg, the best share and the teach arm."""
    all_arms = arms(r.budget)
    r.run("base", {}, m0_targets(r, choices["m0_wd"], seeds) + arm_targets(r, all_arms["msg"], [choices["arm_wd"]], seeds),
          copy_of=None)
    r.run_many({arm["folder"]: (arm["overlay"], arm_targets(r, arm, [choices["arm_wd"]], seeds))
                for arm in (all_arms[choices["best_share"]], with_teach(all_arms[choices["best"]]))})


def arm_rows(r: Runner, name: str, arm: dict, m0_wd: float, arm_wd: float, seeds) -> list[dict]:
    """One row per seed of an arm against M_0 (base folder), by growlm.compare.compare_one."""

    run, base = r.folder(arm["folder"]), r.folder("base")
    out = []
    for seed in seeds:
        m0 = base / baseline_dir(r.budget, optim(M0_LR, m0_wd), seed)
        m1 = run / refined_dir(arm, r.budget, optim(ARM_LR, arm_wd), seed)
        if not (m1 / "ledger.csv").is_file() or not (m0 / "ledger.csv").is_file():
            continue
        combo = {"d0": arm["d0"], "L0": arm["L0"], "d1": SIZES["d1"], "L1": SIZES["L1"], "n": arm["n"],
                 "method": arm["method"], "seed": seed, "budget": r.budget, "lr": optim(ARM_LR, arm_wd)}
        paths = {"baseline": str(base / "results/models/baseline/d{d1}_L{L1}/t{budget}_lr{lr}/s{seed}"),
                 "refined": str(run / "results/models/refined/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/t{budget}_lr{lr}/s{seed}"),
                 "grown": str(run / "results/models/grown/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/s{seed}")}
        tokens = {"large": run / "results/tokens/level1/train.npy", "members": run / "results/tokens/level0/train.npy"}
        if (run / "results/tokens/level0+1/train.npy").is_file():
            tokens["large"] = run / "results/tokens/level0+1/train.npy"
        row, _ = compare_in(run, combo, paths, m0_lr=optim(M0_LR, m0_wd), envelope_dirs={"m0": [m0], "m1": [m1]},
                            branches={"baseline": POINTS, "refine": POINTS}, token_files=tokens)
        out.append({"arm": name, **row, "m0_flops_share_of_cooldowns": row["cooldown_flops"] / row["m0_flops"]})
    return out


def summarise(root: Path, budgets: list[int]) -> pd.DataFrame:
    rows = []
    for budget in budgets:
        r = Runner(root, budget, 1)
        state = root / f"run_envelope_{budget}_choices.json"
        if not state.is_file():
            continue
        choices = json.loads(state.read_text())
        everything = arms(budget)
        everything[choices["teach"]] = with_teach(everything[choices["best"]])
        for name, arm in everything.items():
            rows += arm_rows(r, name, arm, choices["m0_wd"], choices["arm_wd"], (0, 1, 2))
    seeds = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    seeds.to_csv(OUT / "envelope_seeds.csv", index=False)
    if seeds.empty:
        return seeds
    for column in ("m0_passes", "members_passes"):  # absent where no member's record names its tokens
        if column not in seeds:
            seeds[column] = float("nan")
    g = seeds.groupby(["budget", "arm"], sort=False)
    table = g.agg(tokens_per_param=("tokens_per_param", "first"), m0_passes=("m0_passes", "first"),
                  members_passes=("members_passes", "first"), seeds=("seed", "nunique"),
                  reached_by_envelope=("envelope_reached", "sum"), reached_within=("reached", "sum"),
                  m0_weight_decay=("m0_weight_decay", "first"), m1_weight_decay=("m1_weight_decay", "first"),
                  small_flops_share=("small_flops", "first"),
                  envelope_ratio=("envelope_ratio", "mean"), envelope_ratio_std=("envelope_ratio", "std"),
                  envelope_ratio_small_free=("envelope_ratio_small_free", "mean"),
                  cost_ratio=("cost_ratio", "mean"), cost_ratio_std=("cost_ratio", "std"),
                  cost_ratio_small_free=("cost_ratio_small_free", "mean"),
                  m0_final_val_loss=("m0_final_val_loss", "mean"), m1_final_val_loss=("m1_final_val_loss", "mean"),
                  cooldowns_share_of_m0=("m0_flops_share_of_cooldowns", "mean"),
                  m0_flops=("m0_flops", "first")).reset_index()
    table["small_flops_share"] = table["small_flops_share"] / table["m0_flops"]
    table = table.drop(columns="m0_flops")
    table.to_csv(OUT / "envelope_table.csv", index=False)
    tuning(root, budgets).to_csv(OUT / "envelope_m0_tuning.csv", index=False)
    return table


def tuning(root: Path, budgets: list[int]) -> pd.DataFrame:
    """Every M_0 trained in the base folders: its budget, rate, weight decay, seed, final validation loss and
    its branches' final losses (M_0's weight decay is chosen on seed 0's final loss)."""
    from growlm.compare import final_val_loss

    rows = []
    for budget in budgets:
        base = Runner(root, budget, 1).folder("base") / "results" / "models" / "baseline"
        for model in sorted(base.glob("*/*/s*")):
            if not (model / "ledger.csv").is_file():
                continue
            meta = json.loads((model / "growlm.json").read_text())["train"]["config"]
            row = {"budget": budget, "lr": meta["lr"], "weight_decay": meta["weight_decay"],
                   "seed": int(model.name[1:]), "final_val_loss": final_val_loss(model)}
            for p in POINTS:
                record = model / "branches" / f"b{p}" / "branch.json"
                row[f"branch_{p}_loss"] = json.loads(record.read_text())["final_val_loss"] if record.is_file() else None
            rows.append(row)
    return pd.DataFrame(rows)


def passes_point(root: Path, cores: int, choices: dict) -> None:
    """The large models on both levels' training text for 3 passes (seed 0): M_0 at weight decays 0.1 and 0.3,
    msg and the best `members x%`."""
    import numpy as np

    base = root / f"run_envelope_{BUDGETS['32']}_base" / "results" / "tokens"
    total = sum(np.load(base / f"level{lv}" / "train.npy", mmap_mode="r").size for lv in (0, 1))
    budget = int(round(3 * total, -3))
    r = Runner(root, budget, cores)
    levels = {"levels": {"large": [0, 1], "evaluate": 1}}
    r.run("base", levels, m0_targets(r, 0.1, (0,)) + m0_targets(r, 0.3, (0,)), copy_of=None)
    m0_wd = min((0.1, 0.3), key=lambda wd: final_loss(r.folder("base"), baseline_dir(budget, optim(M0_LR, wd), 0)))
    all_arms = arms(budget)
    for name in ("msg", choices["best_share"]):
        arm = all_arms[name]
        overlay = {**arm["overlay"], **levels}
        r.run(arm["folder"], overlay, arm_targets(r, arm, [0.1], (0,)))
    (root / f"run_envelope_{budget}_choices.json").write_text(json.dumps(
        {"m0_wd": m0_wd, "arm_wd": 0.1, "best": "msg", "best_share": choices["best_share"], "teach": "msg + teach",
         "passes_point": True}, indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--root", type=Path, default=REPO / "bench", help="where the run folders go")
    ap.add_argument("--budgets", default="32,8,passes", help="tokens per parameter to run: 32, 8, passes")
    ap.add_argument("--summarise-only", action="store_true")
    args = ap.parse_args(argv)
    wanted = args.budgets.split(",")
    if not args.summarise_only:
        for key in ("32", "8"):
            if key in wanted:
                r = Runner(args.root, BUDGETS[key], args.cores)
                choices = choose(r)
                more_seeds(r, choices)
                summarise(args.root, list(BUDGETS.values()))
        if "passes" in wanted:
            choices = json.loads((args.root / f"run_envelope_{BUDGETS['32']}_choices.json").read_text())
            passes_point(args.root, args.cores, choices)
    budgets = [*BUDGETS.values(), *(int(p.name.split("_")[2]) for p in args.root.glob("run_envelope_*_choices.json"))]
    table = summarise(args.root, sorted(set(budgets), reverse=True))
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
