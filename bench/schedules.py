"""Cosine against warmup-stable-decay, and growth before the decay: section 8's arms under both schedules.

    .venv/bin/python bench/schedules.py                   # three workflow runs (hours on 2 cores), then the table
    .venv/bin/python bench/schedules.py --only cosine     # one of them (wsd, "wsd, before decay", cosine)
    .venv/bin/python bench/schedules.py --summarise-only  # the table and plot from finished runs

The setting is section 8's (bench/savings.yaml + bench/budgets.yaml: members d0 = 32, L0 = 2 trained 150k tokens
on level 0; M_0 and M_1 d1 = 64, L1 = 4 on level 1; `msg` from m_1 and `msg_members` + `carry` from both members;
3 seeds; every large arm at its own best of the peak rates 4e-3 and 8e-3) at M_0's budgets of 400k and 6.4M tokens
(bench/schedules.yaml), run three times, each in its own folder:

* `cosine` (bench/run_schedules_cosine): growlm's cosine, as section 8 ran it: M_0 at both budgets, both rates and
  every seed, the arms at 400k only (where it checks that it reproduces section 8's numbers to the last digit;
  their 6.4M figures are section 8's, bench/results/budgets_table.csv: the same setting and the same computation);
* `wsd` (bench/run_schedules_wsd): every job - members, M_0, refinements - under warmup-stable-decay
  (bench/schedules_wsd.yaml: the same warm-up, the peak held, the last 20% of the steps decaying to the same
  floor, 1-sqrt), the members grown as they end (annealed);
* `wsd, before decay` (bench/run_schedules_before_decay, a copy of the wsd folder, so that its members and M_0
  are the wsd run's own): the members grown where their decay began, their training up to there counted
  (bench/schedules_before_decay.yaml); only growth and the refinements run again, at 8e-3 only (the rate every
  arm refined best at under both schedules: BEFORE_DECAY_LR).

The runs go in the order wsd, wsd before decay, cosine.

The table (bench/results/schedules_table.csv, per seed in schedules_table_seeds.csv, drawn in schedules_table.svg)
gives per arm, schedule and budget: how many seeds reached M_0's final validation loss, the cost ratio with the
members counted and free (growlm.compare: mean and standard deviation over the seeds that reached it), M_0's and
M_1's final and best validation loss, and M_0's budget in tokens per parameter (non-embedding and total). Each
wsd arm is compared twice: against M_0 trained under wsd (its own run) and against M_0 trained under the cosine
(the cosine run's M_0 at its own best rate), by growlm's own comparison function (growlm.compare.compare_one);
without a cosine run, against section 8's cosine M_0's mean final loss (against_section8_m0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

from budgets import best_losses
from savings import run_workflow

OVERLAYS = [REPO / "bench" / "budgets.yaml", REPO / "bench" / "schedules.yaml"]
ARMS = {"d0": 32, "L0": 2, "d1": 64, "L1": 4, "n": 2, "seeds": (0, 1, 2), "budgets": (400_000, 6_400_000),
        "lrs": ("0.004", "0.008"), "methods": ("msg", "msg_members+carry")}
PATHS = {"baseline": "results/models/baseline/d{d1}_L{L1}/t{budget}_lr{lr}/s{seed}",
         "grown": "results/models/grown/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/s{seed}",
         "refined": "results/models/refined/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/t{budget}_lr{lr}/s{seed}"}
# section 8's cosine arms (bench/results/budgets_table.csv, the same setting and, for the cosine, the same numbers):
# the cosine run trains M_0 at both budgets and the arms at 400k only, where it checks that it reproduces them
SECTION8 = REPO / "bench" / "results" / "budgets_table.csv"


def combos(budgets=ARMS["budgets"]) -> list[dict]:
    keys = {k: ARMS[k] for k in ("d0", "L0", "d1", "L1", "n")}
    return [{**keys, "method": m, "seed": s, "budget": b, "lr": lr} for b in budgets for m in ARMS["methods"]
            for s in ARMS["seeds"] for lr in ARMS["lrs"]]


def evaluated(model: str) -> str:
    return model.replace("models/", "eval/", 1) + "/metrics.json"


def cosine_targets() -> list[str]:
    """What the cosine run trains: M_0 at every budget, rate and seed, and the arms at the smallest budget."""
    m0 = [evaluated(PATHS["baseline"].format(**c)) for c in combos()]
    m1 = [evaluated(PATHS["refined"].format(**c)) for c in combos(ARMS["budgets"][:1])]
    return list(dict.fromkeys(m0 + m1))


# the rate every arm refined best at, at both budgets, under the cosine (section 8) and under wsd (the wsd run)
BEFORE_DECAY_LR = "0.008"


def before_decay_targets() -> list[str]:
    """What the before-decay run trains: the arms at BEFORE_DECAY_LR only (M_0 and the members are the wsd run's),
    half the refinements of a full grid; its rows come from growlm.compare.compare_one (arm_rows)."""
    return [evaluated(PATHS["refined"].format(**c)) for c in combos() if c["lr"] == BEFORE_DECAY_LR]


# (name, run folder, its overlays on top of OVERLAYS, the folder it starts as a copy of, its targets: None for all)
RUNS = [("wsd", "run_schedules_wsd", ["schedules_wsd.yaml"], None, None),
        ("wsd, before decay", "run_schedules_before_decay", ["schedules_wsd.yaml", "schedules_before_decay.yaml"],
         "run_schedules_wsd", before_decay_targets),
        ("cosine", "run_schedules_cosine", [], None, cosine_targets)]


def run_all(cores: int, root: Path, extra: list[str], only: list[str] | None = None) -> None:
    """The three runs, one after the other (the second in a copy of the first's finished folder)."""
    for name, folder, overlays, copy_of, targets in RUNS:
        if only and name not in only:
            continue
        run = root / folder
        if copy_of is not None and not run.exists():
            shutil.copytree(root / copy_of, run, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
            for made in ("models/grown", "models/refined", "eval/refined", "eval/comparison.csv"):  # the copied run's
                path = run / "results" / made
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        run_workflow(cores, [*extra, *(targets() if targets else [])],
                     [*OVERLAYS, *(REPO / "bench" / o for o in overlays)], run)


def m0_params(run: Path) -> tuple[int, int]:
    """(non-embedding, total) parameters of the run's M_0, from its config.json."""
    from growlm.errors import read_json
    from growlm.pretrained import shape_of_config

    config = next((run / "results" / "models" / "baseline").glob("*/*/s*/config.json"))
    shape = shape_of_config(read_json(config), str(config))
    return shape.n_params - shape.embedding_params, shape.n_params


def own_rows(name: str, run: Path) -> pd.DataFrame:
    """The run's own comparison (each M_1 against M_0 of the same run), one row per arm, budget and seed, with
    every arm's final and best validation loss."""
    comparison = pd.read_csv(run / "results" / "eval" / "comparison.csv")
    return with_losses(comparison, pd.read_csv(run / "results" / "eval" / "curves.csv")).assign(
        schedule=name, m0_schedule=name.split(",")[0])


def m0_rates(run: Path) -> dict[int, str]:
    """M_0's best rate per budget in a run: the lowest final validation loss averaged over the seeds."""
    from growlm.compare import final_val_loss

    losses = {}
    for c in combos():
        d = run / PATHS["baseline"].format(**c)
        if (d / "ledger.csv").is_file():
            losses.setdefault((c["budget"], c["lr"]), {})[c["seed"]] = final_val_loss(d)
    means = pd.Series({k: sum(v.values()) / len(v) for k, v in losses.items()})
    return {b: means[b].idxmin() for b in means.index.get_level_values(0).unique()}


def arm_rows(run: Path, budgets, schedule: str, m0_schedule: str) -> pd.DataFrame:
    """A run's arms at `budgets`, each at its own best rate among those the run refined, against the run's M_0 at
    its own best rate, by growlm.compare.compare_one (for runs that train part of the grid, so have no
    comparison.csv of their own)."""
    from growlm.compare import compare_one, final_val_loss

    m0_lr = m0_rates(run)
    done = [c for c in combos(budgets) if (run / PATHS["refined"].format(**c) / "ledger.csv").is_file()]
    m1 = pd.DataFrame([{**c, "final": final_val_loss(run / PATHS["refined"].format(**c))} for c in done])
    best = m1.groupby(["method", "budget", "lr"])["final"].mean().reset_index().sort_values(["final", "lr"]) \
        .drop_duplicates(["method", "budget"]).set_index(["method", "budget"])["lr"]
    here = os.getcwd()
    os.chdir(run)
    try:
        rows, curves = [], []
        for c in done:
            if c["lr"] == best[(c["method"], c["budget"])]:
                row, cs = compare_one(c, PATHS, m0_lr=m0_lr[c["budget"]])
                rows.append(row)
                curves.extend(cs)
    finally:
        os.chdir(here)
    return with_losses(pd.DataFrame(rows), pd.concat(curves, ignore_index=True)).assign(
        schedule=schedule, m0_schedule=m0_schedule)


def with_losses(comparison: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    losses = best_losses(curves)
    keys = ["method", "seed", "budget"]
    m0 = losses[losses["arm"].str.startswith("M_0")].groupby(keys)[["final", "best"]].first()
    m1 = losses[losses["arm"].str.startswith("M_1")].groupby(keys)[["final", "best"]].first()
    df = comparison.join(m0.add_prefix("m0_"), on=keys).join(m1.add_prefix("m1_"), on=keys)
    df["reached"] = df["m1_flops_to_m0_loss"].notna()
    return df


def against_cosine_m0(name: str, run: Path, cosine: Path) -> pd.DataFrame:
    """Each M_1 of a wsd run (at its own best rate) against the cosine run's M_0 (at its best rate), by
    growlm.compare.compare_one, the function the workflow's comparison uses."""
    from growlm.compare import compare_one

    own = pd.read_csv(run / "results" / "eval" / "comparison.csv")
    m0_lrs = m0_rates(cosine)
    paths = {**PATHS, "baseline": str(cosine.resolve() / PATHS["baseline"])}
    here = os.getcwd()
    os.chdir(run)  # the growth records name the members' folders relative to the run
    try:
        rows, curves = [], []
        for _, r in own.iterrows():
            combo = {k: r[k] for k in ("d0", "L0", "d1", "L1", "n", "method", "seed", "budget")}
            combo["lr"] = f"{float(r['m1_lr']):g}"
            row, c = compare_one(combo, paths, m0_lr=m0_lrs[int(r["budget"])])
            rows.append(row)
            curves.extend(c)
    finally:
        os.chdir(here)
    return with_losses(pd.DataFrame(rows), pd.concat(curves, ignore_index=True)).assign(
        schedule=name, m0_schedule="cosine")


def against_section8_m0(rows: pd.DataFrame, run: Path) -> pd.DataFrame:
    """The arms of a wsd run against the cosine M_0's final validation loss (section 8's mean over its seeds at
    4e-3, its best rate), when no cosine run of this benchmark is at hand: M_0's FLOPs are the same under both
    schedules (the same model and tokens), so the cost ratio is (the members' and growth's FLOPs + M_1's FLOPs
    to that loss) / M_0's FLOPs, as growlm.compare counts it, with the cosine M_0's mean loss as the target."""
    from growlm.compare import first_reach, read_ledger

    s8 = pd.read_csv(SECTION8).groupby("budget")["m0_final"].first()
    out = []
    for _, r in rows.iterrows():
        combo = {k: r[k] for k in ("d0", "L0", "d1", "L1", "n", "method", "seed", "budget")}
        combo["lr"] = f"{float(r['m1_lr']):g}"
        m1 = read_ledger(run / PATHS["refined"].format(**combo) / "ledger.csv")
        target = float(s8[int(r["budget"])])
        reach = first_reach(m1, target, "flops")
        offset = r["small_flops"] + r["growth_flops"]
        out.append({**r.to_dict(), "m0_final": target, "m0_best": float("nan"), "m1_flops_to_m0_loss": reach,
                    "cost_ratio": (offset + reach) / r["m0_flops"],
                    "cost_ratio_small_free": (r["growth_flops"] + reach) / r["m0_flops"],
                    "reached": reach == reach, "m0_schedule": "cosine (section 8, mean loss)"})
    return pd.DataFrame(out)


def table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per arm, schedule, M_0's schedule and budget, over the seeds."""
    def reached_mean(s):  # over the seeds that reached M_0's loss (the others have no ratio)
        return s[rows.loc[s.index, "reached"]].mean()

    def reached_std(s):
        return s[rows.loc[s.index, "reached"]].std()

    out = rows.groupby(["method", "schedule", "m0_schedule", "budget"], sort=False).agg(
        seeds=("seed", "nunique"), reached=("reached", "sum"), m0_lr=("m0_lr", "first"), m1_lr=("m1_lr", "first"),
        cost_ratio=("cost_ratio", reached_mean), cost_ratio_std=("cost_ratio", reached_std),
        small_free=("cost_ratio_small_free", reached_mean), small_free_std=("cost_ratio_small_free", reached_std),
        members_share=("small_flops", "mean"), m0_flops=("m0_flops", "mean"),
        m0_final=("m0_final", "mean"), m0_best=("m0_best", "mean"), m1_final=("m1_final", "mean"),
        m1_best=("m1_best", "mean"), m1_final_std=("m1_final", "std"),
    ).reset_index()
    out["members_share"] = out["members_share"] / out.pop("m0_flops")  # the members' FLOPs over M_0's
    return out


def plot(t: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (budget, g) in zip(axes, t.groupby("budget")):
        labels = [f"{m}\n{s} vs M_0 {m0}" for m, s, m0 in zip(g["method"], g["schedule"], g["m0_schedule"])]
        y = range(len(g))
        ax.barh(y, g["cost_ratio"], xerr=g["cost_ratio_std"].fillna(0), color="tab:blue", label="members counted")
        ax.scatter(g["small_free"], y, color="tab:orange", zorder=3, label="members free")
        ax.set_yticks(list(y), labels, fontsize=6)
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.axvline(0.4, color="tab:green", lw=0.8, ls="--", label="0.40")
        ax.set_title(f"M_0's budget {int(budget):,} tokens ({g['tokens_per_param'].iloc[0]:.1f} per non-embedding "
                     f"parameter)", fontsize=8)
        ax.set_xlabel("FLOPs to M_0's final loss / M_0's FLOPs")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)


def section8_rows(budgets) -> pd.DataFrame:
    """Section 8's cosine arms at `budgets` (its table: means over the seeds), in this table's columns."""
    t = pd.read_csv(SECTION8)
    return t[t["budget"].isin(budgets)].assign(schedule="cosine (section 8)", m0_schedule="cosine")[
        ["method", "schedule", "m0_schedule", "budget", "seeds", "reached", "m0_lr", "m1_lr", "cost_ratio",
         "cost_ratio_std", "small_free", "small_free_std", "m0_final", "m0_best", "m1_final", "m1_best"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--summarise-only", action="store_true")
    ap.add_argument("--only", action="append", choices=[name for name, *_ in RUNS],
                    help="run only this run (again for another); default all three")
    ap.add_argument("--root", default=str(REPO / "bench"), help="where the run folders are (default bench/)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "schedules_table.csv"))
    args, extra = ap.parse_known_args(argv)
    root = Path(args.root)
    if not args.summarise_only:
        run_all(args.cores, root, extra, args.only)
    runs = {name: root / folder for name, folder, *_ in RUNS if (root / folder / "results" / "models").is_dir()}
    wsd = {name: run for name, run in runs.items() if name == "wsd"
           and (run / "results" / "eval" / "comparison.csv").is_file()}
    cosine = runs.get("cosine")
    if cosine is not None and not all((cosine / PATHS["baseline"].format(**c) / "ledger.csv").is_file()
                                      for c in combos()):
        cosine = None
    missing = [name for name, *_ in RUNS if name not in wsd and name != "wsd, before decay"
               and not (name == "cosine" and cosine is not None)]
    if missing:
        print(f"not finished (left out): {', '.join(missing)}")
    rows = [own_rows(name, run) for name, run in wsd.items()]
    before = runs.get("wsd, before decay")
    if before is not None and any((before / PATHS["refined"].format(**c) / "ledger.csv").is_file() for c in combos()
                                  if c["lr"] == BEFORE_DECAY_LR):
        rows.append(arm_rows(before, ARMS["budgets"], "wsd, before decay", "wsd"))
    elif "wsd, before decay" not in missing:
        print("not finished (left out): wsd, before decay")
    if cosine is not None:
        rows += [arm_rows(cosine, ARMS["budgets"][:1], "cosine", "cosine")]
        rows += [against_cosine_m0(name, run, cosine) for name, run in wsd.items()]
    else:  # against the cosine M_0's loss from section 8 (the same setting): M_0's FLOPs do not depend on it
        rows += [against_section8_m0(r, runs[r["schedule"].iloc[0]]) for r in list(rows)]
    seeds = pd.concat(rows, ignore_index=True)
    t = table(seeds)
    ours = t[t["schedule"] == "cosine"]
    if len(ours):  # the cosine run against section 8's runs of the same arms: the same numbers, to the last digit
        s8 = section8_rows(ours["budget"].unique()).set_index(["method", "budget"])
        for _, r in ours.iterrows():
            theirs = s8.loc[(r["method"], r["budget"])]
            same = all(r[k] == theirs[k] for k in ("cost_ratio", "small_free", "m0_final", "m1_final"))
            print(f"cosine {r['method']} at {r['budget']}: {'the same as' if same else 'NOT the same as'} section 8 "
                  f"(cost ratio {r['cost_ratio']!r} against {theirs['cost_ratio']!r})")
    t = pd.concat([t, section8_rows([b for b in ARMS["budgets"] if b not in set(ours["budget"])])], ignore_index=True)
    non_embedding, total = m0_params(next(iter(runs.values())))
    t["tokens_per_param"] = t["budget"] / non_embedding
    t["tokens_per_param_total"] = t["budget"] / total
    cols = ["method", "schedule", "m0_schedule", "budget", "seed", "m0_lr", "m1_lr", "reached", "cost_ratio",
            "cost_ratio_small_free", "small_flops", "m0_flops", "m0_final", "m0_best", "m1_final", "m1_best"]
    seeds[cols].sort_values(["method", "budget", "schedule", "m0_schedule", "seed"]).to_csv(
        Path(args.out).with_name(Path(args.out).stem + "_seeds.csv"), index=False)
    t = t.sort_values(["method", "budget", "m0_schedule", "schedule"])
    t.to_csv(args.out, index=False)
    plot(t, Path(args.out).with_suffix(".svg"))
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(t.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
