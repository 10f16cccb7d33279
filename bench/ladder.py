"""Does the saving grow with the model? The size ladder on text seen once, and a prediction checked against a run it
did not see (bench/RESULTS.md, section 16).

    GROWLM_MIRROR=../shared/corpus/gitenberg .venv/bin/python bench/ladder.py --sizes 24,32,48   # the ladder
    .venv/bin/python bench/ladder.py --predict 64        # the prediction from the finished sizes, written first
    GROWLM_MIRROR=... .venv/bin/python bench/ladder.py --sizes 64 --arms lever    # then the check
    GROWLM_MIRROR=... .venv/bin/python bench/ladder.py --sizes 24,32 --tokens-per-param 20   # a longer budget
    .venv/bin/python bench/ladder.py --summarise-only    # the tables from the finished runs

Setting (bench/ladder.yaml beside config/children-large.yaml): the 326 Gutenberg children's books, members on
level 0, M_0 and M_1 on level 1 (about 5.5M training tokens at this vocabulary of 2,048, so no size here reads its
text more than about 0.6 times, M_0's doubled run included), every job under wsd. At each size M_1 is d1 wide and
4 deep and its member d1 / 2 wide and 2 deep (section 8's depths); M_0 and M_1 train on 8 tokens per
non-embedding parameter (growlm.predict.nonembedding_params), rounded to whole batches; M_0 trains twice that
with cooldown branches at 0.2, 0.35, 0.5, 0.7, 1 and 1.5 of its budget's stable phase, so its finished runs bracket
every arm's final loss; the multiplier is growlm's (growlm.multiplier: M_0's finished runs fitted with
L(C) = E + A C^-alpha, C_0(L_1) / C_1 with a 95% interval from a bootstrap over seeds), members counted and free.

Arms (RESULTS 15's): `msg` from one member trained in full on 6 tokens per member parameter (section 15's member
at d0 = 32 read 150k tokens, 6.1 per parameter), and `msg, members 10%`, the best lever of section 15: the member
given 10% of M_0's FLOPs, grown from before its decay, refined without a re-warm-up. msg's mask ramp is 5% of the
refinement's steps at every size (section 15's 40 of 781).

What was cut to fit two CPU cores (section 16 says so beside its table): M_0 and the arms at section 15's tuned
rates (4e-3 and 8e-3, weight decay 0.1) at every size rather than tuned per size; 8 tokens per parameter only
(not 20); the predicted size runs the predicted arm only.

Folders under --root: run_ladder_corpus (the corpus and tokenizer, once), then per size run_ladder_d<d1>_base (M_0
and msg) and run_ladder_d<d1>_share0.1 (the lever, a copy of the base folder that reuses its corpus and M_0); a
budget other than 8 tokens per parameter has folders of its own, run_ladder_d<d1>_tpp<r>_base and _share0.1 (the
lever's member and every grown model are named without the budget, so two budgets in one folder would overwrite
each other's).

Writes bench/results/ladder_seeds.csv (growlm's comparison row of every size, arm and seed with its multiplier
columns), ladder_table.csv (one row per size and arm), ladder_curves.csv (every evaluation of every run) and
ladder_trend.csv (the trend over the sizes, as `python -m growlm.predict` prints it); --predict writes
ladder_prediction.csv, which the check reads back.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

OUT = REPO / "bench" / "results"
OVERLAYS = [REPO / "config" / "config.yaml", REPO / "config" / "children-large.yaml", REPO / "bench" / "ladder.yaml"]
TOKENS_PER_PARAM = 8
MEMBER_TOKENS_PER_PARAM = 6
BATCH_TOKENS = 16 * 128
M0_LR, ARM_LR, WD = "0.004", "0.008", 0.1
EXTEND = 2
M0_POINTS = (0.2, 0.35, 0.5, 0.7, 1.0, (1 + EXTEND) / 2)
RAMP_SHARE = 0.05
LEVER = "msg, members 10%"
ARMS = {"msg": {"folder": "base", "method": "msg", "overlay": {}},
        LEVER: {"folder": "share0.1", "method": "msg",
                "overlay": {"members": {"flops_share": 0.1, "source": "before_decay"},
                            "train": {"refine": {"warmup_steps": 0}}}}}


def model_settings() -> dict:
    return yaml.safe_load((REPO / "bench" / "ladder.yaml").read_text())["model"]


def params(d: int, L: int) -> int:
    from growlm.predict import nonembedding_params

    return nonembedding_params(d, L, model_settings())


def batches(tokens: float) -> int:
    return max(1, round(tokens / BATCH_TOKENS)) * BATCH_TOKENS


def size(d1: int, tpp: float = TOKENS_PER_PARAM) -> dict:
    """A rung at `tpp` tokens per parameter: M_1's and its member's shapes, the budget, msg's member tokens and mask
    ramp (a share of the refinement's steps, so the same share at every budget)."""
    d0, L0, L1 = d1 // 2, 2, 4
    budget = batches(tpp * params(d1, L1))
    return {"d0": d0, "L0": L0, "d1": d1, "L1": L1, "budget": budget, "tpp": tpp,
            "small_tokens": batches(max(MEMBER_TOKENS_PER_PARAM * params(d0, L0), 40 * BATCH_TOKENS)),
            "ramp_steps": max(1, round(RAMP_SHARE * budget / BATCH_TOKENS))}


def size_overlay(s: dict) -> dict:
    return {"d0": [s["d0"]], "L0": [s["L0"]], "d1": [s["d1"]], "L1": [s["L1"]], "budgets": [s["budget"]],
            "train": {"small": {"tokens": s["small_tokens"]}, "large": {"tokens": s["budget"]}},
            "grow": {"options": {"msg": {"ramp_steps": s["ramp_steps"]}}}}


def optim(lr: str) -> str:
    from growlm.experiment import optim_id

    return optim_id(lr, WD, 0.1)


def m0_model(s: dict, seed: int) -> str:
    return f"results/models/baseline/d{s['d1']}_L{s['L1']}/t{s['budget']}_lr{optim(M0_LR)}/s{seed}"


def m1_model(s: dict, arm: dict, seed: int) -> str:
    return (f"results/models/refined/{arm['method']}/d{s['d0']}_L{s['L0']}_to_d{s['d1']}_L{s['L1']}/n1/"
            f"t{s['budget']}_lr{optim(ARM_LR)}/s{seed}")


def point_ids(points) -> list[str]:
    from growlm.envelope import point_id

    return [point_id(p) for p in points]


def targets(model: str, points=()) -> list[str]:
    """What to ask Snakemake for: as bench/multiplier.py's `targets`, never the ledger itself (asking for a
    finished model's ledger would train it again to remake its branches' temporary states)."""
    return [model.replace("models/", "eval/", 1) + "/metrics.json",
            *(f"{model}/branches/b{p}/branch.json" for p in point_ids(points))]


def folder(root: Path, s: dict, arm: dict) -> Path:
    """A size's folder for an arm; a budget other than the default's has folders of its own (the lever's member and
    every grown model are named without the budget)."""
    at = "" if s["tpp"] == TOKENS_PER_PARAM else f"_tpp{s['tpp']:g}"
    return root / f"run_ladder_d{s['d1']}{at}_{arm['folder']}"


def snakemake(run: Path, overlay: dict, wanted: list[str], cores: int) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "ladder_size.yaml").write_text(json.dumps(overlay) + "\n")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "workflow" / "Snakefile"), "--directory", str(run),
           "--configfile", *map(str, OVERLAYS), "ladder_size.yaml", "--cores", str(cores),
           "--workflow-profile", "none", "--keep-going", "--rerun-incomplete", *wanted]
    print(f"[{run.name}] {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, cwd=run)


def corpus(root: Path, cores: int) -> Path:
    """The corpus and tokenizer, built once; every size's folder starts from a copy of it."""
    run = root / "run_ladder_corpus"
    snakemake(run, {}, ["results/tokenizer/tokenizer.json", "results/tokens/level0/train.npy",
                        "results/tokens/level1/train.npy", "results/tokens/level1/val.npy"], cores)
    return run


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run_size(root: Path, d1: int, arm_names, seeds, cores: int, tpp: float = TOKENS_PER_PARAM) -> None:
    """A rung's M_0 and msg in its base folder (from a copy of the corpus folder), then each other arm in a copy of
    the base folder, side by side."""
    s = size(d1, tpp)
    base = folder(root, s, ARMS["msg"])
    if not base.exists():
        shutil.copytree(root / "run_ladder_corpus", base, symlinks=True,
                        ignore=shutil.ignore_patterns("locks", "incomplete"))
    wanted = [t for seed in seeds for t in targets(m0_model(s, seed), M0_POINTS)]
    if "msg" in arm_names:
        wanted += [t for seed in seeds for t in targets(m1_model(s, ARMS["msg"], seed))]
    snakemake(base, size_overlay(s), wanted, cores)
    others = [n for n in arm_names if ARMS[n]["folder"] != "base"]
    jobs = []
    for name in others:
        arm = ARMS[name]
        run = folder(root, s, arm)
        if not run.exists():
            shutil.copytree(base, run, symlinks=True,
                            ignore=shutil.ignore_patterns("locks", "incomplete", "grown", "refined"))
        jobs.append((run, merge(size_overlay(s), arm["overlay"]),
                     [t for seed in seeds for t in targets(m1_model(s, arm, seed))]))
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        for done in [pool.submit(snakemake, run, o, w, max(1, cores // max(1, len(jobs)))) for run, o, w in jobs]:
            done.result()


def arm_rows(root: Path, s: dict, name: str, seeds) -> tuple[list[dict], list[pd.DataFrame], list[pd.DataFrame]]:
    """Each finished seed's comparison row of an arm at a size against M_0, its curves and M_0's finished runs."""
    from envelope import compare_in
    from growlm.runs import arm_ends

    arm = ARMS[name]
    base, run = folder(root, s, ARMS["msg"]), folder(root, s, arm)
    rows, curves, ends = [], [], []
    for seed in seeds:
        m0, m1 = base / m0_model(s, seed), run / m1_model(s, arm, seed)
        wanted = [base / t for t in targets(m0_model(s, seed), M0_POINTS)]
        wanted += [run / t for t in targets(m1_model(s, arm, seed))]
        if not all(f.is_file() for f in wanted):
            continue
        combo = {**{k: s[k] for k in ("d0", "L0", "d1", "L1")}, "n": 1, "method": arm["method"], "seed": seed,
                 "budget": s["budget"], "lr": optim(ARM_LR)}
        paths = {"baseline": str(base / "results/models/baseline/d{d1}_L{L1}/t{budget}_lr{lr}/s{seed}"),
                 "refined": str(run / "results/models/refined/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/"
                                      "t{budget}_lr{lr}/s{seed}"),
                 "grown": str(run / "results/models/grown/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/s{seed}")}
        tokens = {"large": run / "results/tokens/level1/train.npy", "members": run / "results/tokens/level0/train.npy"}
        points = {"baseline": point_ids(M0_POINTS), "refine": []}
        row, c = compare_in(run, combo, paths, m0_lr=optim(M0_LR), envelope_dirs={"m0": [m0], "m1": [m1]},
                            branches=points, token_files=tokens)
        rows.append({"arm": name, **row})
        curves += [x.assign(arm_name=name) for x in c]
        ends.append(arm_ends([m0], points["baseline"]).assign(
            **{k: combo[k] for k in ("method", "d0", "L0", "d1", "L1", "n", "budget")}, seed=seed))
    return rows, curves, ends


def finished_sizes(root: Path) -> list[dict]:
    """Every size (and budget) with a base folder under `root`."""
    out = []
    for p in root.glob("run_ladder_d*_base"):
        parts = p.name.split("_")[2:-1]  # d<d1>[, tpp<r>]
        tpp = float(parts[1][3:]) if len(parts) > 1 else TOKENS_PER_PARAM
        out.append(size(int(parts[0][1:]), tpp))
    return sorted(out, key=lambda s: (s["tpp"], s["d1"]))


def summarise(root: Path, seeds=range(10)) -> pd.DataFrame:
    from envelope import write_seeds_and_curves
    from growlm.runs import multiplier_columns

    per_seed, curves = [], []
    for s in finished_sizes(root):
        for name in ARMS:
            rows, c, ends = arm_rows(root, s, name, seeds)
            if rows:
                per_seed.append(multiplier_columns(pd.DataFrame(rows), pd.concat(ends, ignore_index=True)))
                curves += c
    seeds_df = write_seeds_and_curves(per_seed, curves, "ladder",
                                      ["arm", "run", "seed", "budget", "method", "d1", "arm_name"], root, OUT)
    if seeds_df is None:
        return pd.DataFrame()
    table = per_size(seeds_df)
    table.to_csv(OUT / "ladder_table.csv", index=False)
    trend_over(seeds_df).to_csv(OUT / "ladder_trend.csv", index=False)
    figure(seeds_df, OUT / "ladder.svg")
    return table


def trend_over(seeds_df: pd.DataFrame, predict_at: int | None = None, seeds: int | None = None) -> pd.DataFrame:
    """The trend over the sizes in `seeds_df` (growlm.predict, as `python -m growlm.predict` fits it), read at width
    `predict_at` (4 deep) where given."""
    from growlm.predict import fit_trends, points_from_comparison, trend_table

    at = {"params": params(predict_at, 4), "tokens_per_param": TOKENS_PER_PARAM} if predict_at else None
    table = trend_table(fit_trends(points_from_comparison(by_arm(seeds_df))), at, seeds)
    table.insert(0, "from_sizes", " ".join(str(d) for d in sorted(set(seeds_df["d1"]))))
    return table


def by_arm(seeds_df: pd.DataFrame) -> pd.DataFrame:
    """The rows with the arm's name as their method: both arms are msg from one member (growlm.predict tells arms
    apart by method and n), differing in the member's share and where it is grown from."""
    return seeds_df.assign(method=seeds_df["arm"])


def figure(seeds_df: pd.DataFrame, out_svg: Path) -> None:
    """The report's trend figure (multiplier against non-embedding parameters, band and measured points)."""
    import io

    from growlm.report.figures import trend_plot

    trend_plot(io.StringIO(by_arm(seeds_df).to_csv(index=False)), out_svg)


def per_size(per_seed: pd.DataFrame) -> pd.DataFrame:
    g = per_seed.groupby(["budget", "d1", "arm"], sort=True)
    first = ["d0", "L0", "L1", "tokens_per_param", "m0_passes", "multiplier", "multiplier_low",
             "multiplier_high", "multiplier_free", "multiplier_free_low", "multiplier_free_high", "saving",
             "extrapolated", "extrapolation_factor", "m0_points", "m0_seeds", "m1_seeds"]
    table = g.agg(**{c: (c, "first") for c in first if c in per_seed}, seeds=("seed", "nunique"),
                  small_flops=("small_flops", "first"), m0_flops=("m0_flops", "first"),
                  m0_final_val_loss=("m0_final_val_loss", "mean"), m0_final_val_loss_std=("m0_final_val_loss", "std"),
                  m1_final_val_loss=("m1_final_val_loss", "mean"), m1_final_val_loss_std=("m1_final_val_loss", "std"),
                  ).reset_index()
    table.insert(2, "params", [params(d, L) for d, L in zip(table["d1"], table["L1"])])
    table["small_flops_share"] = table.pop("small_flops") / table.pop("m0_flops")
    return table


def predict(d1: int, from_sizes: list[int], seeds: int) -> pd.DataFrame:
    """The multiplier at width d1 read off the trend of the smaller sizes alone (every arm, members counted and
    free) for a measurement over `seeds` seeds, written before d1 is run; the check reads it back beside d1's
    measurement."""
    seeds_df = pd.read_csv(OUT / "ladder_seeds.csv")
    table = trend_over(seeds_df[seeds_df["d1"].isin(from_sizes)], predict_at=d1, seeds=seeds)
    table.insert(0, "predicted_d1", d1)
    table.to_csv(OUT / "ladder_prediction.csv", index=False)
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--root", type=Path, default=REPO / "bench", help="where the run folders go")
    ap.add_argument("--sizes", default="24,32,48", help="M_1's widths d1 to train, comma-separated")
    ap.add_argument("--arms", choices=("both", "lever"), default="both",
                    help=f"both: {' and '.join(ARMS)}; lever: {LEVER!r} only (M_0 is trained either way)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--tokens-per-param", type=float, default=TOKENS_PER_PARAM,
                    help="M_0's budget in tokens per non-embedding parameter (its own folders where not the default)")
    ap.add_argument("--predict", type=int, help="write the prediction at this width from every finished size, for a "
                    "measurement over as many seeds as --seeds names")
    ap.add_argument("--summarise-only", action="store_true")
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x]
        seeds = [int(x) for x in args.seeds.split(",") if x]
    except ValueError:
        ap.error("--sizes and --seeds take whole numbers separated by commas")
    arm_names = list(ARMS) if args.arms == "both" else [LEVER]
    bad = [d for d in sizes if d % 2 or (d // 2) % int(model_settings()["head_dim"])]
    if bad:
        ap.error(f"widths {bad}: d1 and d1 / 2 must be multiples of the head size {model_settings()['head_dim']}")
    if args.predict:
        if not (OUT / "ladder_seeds.csv").is_file():
            ap.error(f"--predict: {OUT / 'ladder_seeds.csv'} is missing: run the ladder's sizes first")
        done = sorted(set(pd.read_csv(OUT / "ladder_seeds.csv")["d1"]) - {args.predict})
        if len(done) < 2:
            ap.error(f"--predict: the trend needs two finished sizes below d1 = {args.predict}, not {done}")
        print(predict(args.predict, done, len(seeds)).to_string(index=False))
        return 0
    if not args.summarise_only:
        corpus(args.root, args.cores)
        for d1 in sizes:
            run_size(args.root, d1, arm_names, seeds, args.cores, args.tokens_per_param)
            try:  # a table after each size; a fault in it leaves the next size to train
                summarise(args.root)
            except Exception:  # noqa: BLE001
                import traceback

                traceback.print_exc()
    table = summarise(args.root)
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
