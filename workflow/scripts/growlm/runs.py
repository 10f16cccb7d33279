"""A model's runs, as the comparison reads them: its full run and its cooldown branches, each a run that ended
somewhere; their ends, their curves (curves.csv's rows), the cost by envelope of finished runs and the effective
compute multiplier.

Why apart from `growlm.compare`. The comparison puts M_0 and each M_1 side by side; this module knows what a run
is: a ledger (`read_ledger`), a model folder's full run and branches (`model_runs`: under wsd each cooldown branch
is a complete run of a shorter budget, growlm.envelope), which of M_0's runs is the budget's (`m0_at_budget`:
with `baseline.extend` its branch at 1), the curve's evaluations against the precise last one (`on_curve`: a
run's last row reads the whole validation split), and what the field reads off runs that finished: the envelope
of their ends (`envelope_columns`, growlm.envelope.finished_reach) and the multiplier of M_0's fitted curve
(`multiplier_columns`, growlm.multiplier). Torch-free; pandas, and scipy through growlm.multiplier.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from growlm import envelope
from growlm.branches import baseline_ends
from growlm.console import warn
from growlm.errors import GrowlmError, damaged, read_json
from growlm.modes import NOT_RECORDED
from growlm.multiplier import arm_multiplier, fit_power_law, seed_multipliers
from growlm.train_config import TrainConfig

# the keys of an M_1 arm (its seeds apart): the multiplier pools an arm's seeds
M1_ARM_KEYS = ("method", "d0", "L0", "d1", "L1", "n", "budget")


LEDGER_NUMBERS = ("step", "tokens", "flops", "wall_s", "train_loss", "val_loss", "peak_mem_mb")


def read_ledger(path: str | Path) -> pd.DataFrame:
    """A model's ledger (growlm.train): missing columns or rows are a one-line error naming it."""
    path = Path(path)
    if not path.is_file():
        raise GrowlmError(f"ledger {path} is missing")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise damaged(path, f"not a readable CSV: {str(err).splitlines()[0]}") from None
    missing = [c for c in (*LEDGER_NUMBERS, "kind") if c not in df.columns]
    if missing or df.empty or df["val_loss"].isna().all():
        raise damaged(path, f"missing columns {missing}" if missing else "no evaluation rows")
    for col in LEDGER_NUMBERS:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    # the training time: wall seconds less torch.compile's compilation (a ledger without compile_s: none)
    compile_s = pd.to_numeric(df["compile_s"], errors="coerce").fillna(0.0) if "compile_s" in df else 0.0
    df["train_wall_s"] = df["wall_s"] - compile_s
    # how each row was computed (growlm.modes); a ledger of a growlm older than modes does not say
    df["mode"] = df["mode"].fillna(NOT_RECORDED).astype(str) if "mode" in df else NOT_RECORDED
    return df


def model_runs(model_dir, points=None) -> list[tuple[str, pd.DataFrame, dict | None]]:
    """A model's runs: ("full", its ledger, None), then ("branch <fraction>", the branch's ledger, its
    branch.json) for every cooldown branch at `points` (ids, `growlm.envelope.point_id`; None: every branch
    folder there is) that exists. A branch's ledger holds the full run's rows up to where it left (or, for a
    branch run from the start, `from_start`, rows of its own from step 0) and then its cooldown."""
    model_dir = Path(model_dir)
    out = [("full", read_ledger(model_dir / "ledger.csv"), None)]
    if points is None:
        found = sorted((p.name[1:] for p in (model_dir / "branches").glob("b*") if (p / "branch.json").is_file()),
                       key=float)
    else:
        found = [p for p in points if (model_dir / "branches" / f"b{p}" / "ledger.csv").is_file()]
    for p in found:
        folder = model_dir / "branches" / f"b{p}"
        record = read_json(folder / "branch.json")
        out.append((f"branch {float(record.get('fraction', float(p) / 100)):g}", read_ledger(folder / "ledger.csv"),
                    record))
    return out


def final_windows(ledger_path) -> np.ndarray | None:
    """Each validation window's mean loss at a run's last evaluation (`growlm.envelope.windows_path`, beside its
    ledger), or None where the run kept none (a run older than the file, a ledger made elsewhere) or the file is not
    this ledger's (its mean is not the ledger's final loss: left from an earlier run of the folder)."""
    path = envelope.windows_path(ledger_path)
    if not (path.is_file() and Path(ledger_path).is_file()):
        return None
    try:
        windows = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:  # a damaged file: the interval goes without it, said
        warn(f"{path} is not readable ({str(err).splitlines()[0] if str(err) else type(err).__name__}); its arm's "
             "interval is over seeds alone (delete the file, or train the run again, to keep it so silently)")
        return None
    if windows.size < 2 or abs(float(windows.mean()) - run_end(read_ledger(ledger_path))["loss"]) > 1e-4:
        return None
    return windows


def paired_windows(m1_dir, m0_dirs, points=None) -> np.ndarray | None:
    """M_1's last evaluation's window losses minus those of M_0's finished run (its full runs' and cooldown
    branches' ends at `points`, of the same seed) whose final loss lies nearest M_1's: the pair the multiplier's
    reading of M_0's curve at M_1's loss is closest to. None where a run kept no windows or they differ in number."""
    m1 = final_windows(Path(m1_dir) / "ledger.csv")
    if m1 is None:
        return None
    ledgers = [Path(d) / "ledger.csv" for d in m0_dirs]
    ledgers += [Path(d) / "branches" / f"b{p}" / "ledger.csv" for d in m0_dirs for p in (points or [])]
    runs = [(abs(run_end(read_ledger(path))["loss"] - float(m1.mean())), path) for path in ledgers if path.is_file()]
    if not runs:
        return None
    m0 = final_windows(min(runs)[1])
    return None if m0 is None or m0.size != m1.size else m1 - m0


def eval_error(differences) -> tuple[float, int]:
    """The standard error of the seeds' mean loss difference over the windows they share (`paired_windows` of
    each seed): (standard error, windows), the evaluation's error that growlm.multiplier carries into an arm's
    interval (`eval_se`); (NaN, 0) where a seed has none."""
    if not differences or any(d is None for d in differences) or len({d.size for d in differences}) != 1:
        return math.nan, 0
    mean = np.mean(differences, axis=0)
    return float(mean.std(ddof=1) / math.sqrt(mean.size)), int(mean.size)


def m0_at_budget(model_dir, budget: int) -> pd.DataFrame:
    """The ledger of M_0's run of the experiment's budget: its full run's, or - where M_0 ran past the budget
    (`baseline.extend`) - that of its cooldown branch of exactly the budget's steps, a complete wsd run of it
    (growlm.branches.baseline_ends). A folder without growlm's record of its training (a ledger made elsewhere)
    is its full run. A GrowlmError names the folder where no run of M_0 is of the budget."""
    model_dir = Path(model_dir)
    full = read_ledger(model_dir / "ledger.csv")
    record = model_dir / "growlm.json"
    config = (read_json(record).get("train") or {}).get("config") if record.is_file() else None
    if not config:
        return full
    cfg = TrainConfig.from_dict(config)
    if cfg.steps == cfg.with_(tokens=int(budget)).steps:  # not extended: its run is the budget's
        return full
    ends = baseline_ends(model_dir, budget=budget)
    at = [e for e in ends if e["at_budget"]]
    if not at:
        runs = ", ".join(f"{e['run']} ({e['tokens']:,} tokens)" for e in ends)
        raise GrowlmError(f"{model_dir}: no run of M_0 is of the budget of {budget:,} tokens (its runs: "
                          f"{runs}); with baseline.extend "
                          f"its cooldown branch at 1 is that run: rerun its cooldown_baseline job")
    return read_ledger(at[0]["ledger"])


def on_curve(ledger: pd.DataFrame) -> pd.DataFrame:
    """A ledger whose every evaluation is on the curve's windows (`train.eval_tokens`): its last row reads the
    whole validation split (`train.final_eval_tokens`) as `val_loss` and the curve's point as `val_loss_curve`
    (docs/results.md, the precision of a loss). A curve read against another (a first crossing) compares like
    with like; a run's end against another's (the envelope, the multiplier) reads the precise `val_loss`. A
    ledger without the column is its own curve."""
    if "val_loss_curve" not in ledger:
        return ledger
    curve = pd.to_numeric(ledger["val_loss_curve"], errors="coerce")
    return ledger.assign(val_loss=curve.where(curve.notna(), ledger["val_loss"]))


def run_end(ledger: pd.DataFrame) -> dict:
    """A run's last evaluation: its step, tokens, FLOPs, validation loss and that loss's standard error (NaN
    in a ledger that does not record it)."""
    last = ledger.dropna(subset=["val_loss"]).iloc[-1]
    return {"step": int(last["step"]), "tokens": float(last["tokens"]), "flops": float(last["flops"]),
            "loss": float(last["val_loss"]), "loss_se": float(last.get("val_loss_se", math.nan))}


def arm_ends(model_dirs, points, offset: float = 0.0) -> pd.DataFrame:
    """Every finished run of an arm: the end of each model's full run and of each of its cooldown branches at
    `points` (a run that ended there: growlm.envelope), one row each: model, run, step, tokens, FLOPs (+
    `offset`, what the arm is charged before these runs), loss, loss_se, and the run's own cooldown FLOPs (the
    measurement's cost, 0 for a full run)."""
    rows = []
    for d in model_dirs:
        for run, ledger, record in model_runs(d, points):
            end = run_end(ledger)
            rows.append({"model": str(d), "run": run, **end, "flops": end["flops"] + offset,
                         "cooldown_flops": float(record["cooldown_flops"]) if record else 0.0})
    return pd.DataFrame(rows, columns=["model", "run", "step", "tokens", "flops", "loss", "loss_se", "cooldown_flops"])


CURVE_COLUMNS = ("d0", "L0", "d1", "L1", "n", "method", "seed", "budget", "arm", "run", "step", "tokens", "flops",
                 "offset_flops", "total_flops", "val_loss", "val_loss_se", "is_end")


def tidy_run(ledger: pd.DataFrame, record: dict | None, *, arm: str, offset: float, run: str = "full",
             **columns) -> pd.DataFrame:
    """One run's rows of curves.csv: its ledger's rows (a branch's own only: those after it left the full run,
    whose earlier rows are the full run's, unless it ran from the start), with the arm, the run ("full" or
    "branch <fraction>"), what the arm is charged before it (`offset_flops`: members and growth), the loss's
    standard error (NaN where the ledger does not record it) and `is_end` on the run's last evaluation."""
    own = ledger
    if record is not None and not record.get("from_start"):
        own = ledger[ledger["step"] > int(record["step"])]
    own = own.assign(arm=arm, run=run, offset_flops=float(offset), is_end=False, **columns)
    if "val_loss_se" not in own:
        own["val_loss_se"] = math.nan
    evaluated = own.dropna(subset=["val_loss"]).index
    if len(evaluated):
        own.loc[evaluated[-1], "is_end"] = True
    return own


def run_curves(model_dir, points, *, arm: str, offset: float, **columns) -> list[pd.DataFrame]:
    """`tidy_run` of a model's full run and of each of its cooldown branches at `points`."""
    return [tidy_run(ledger, record, arm=arm, offset=offset, run=run, **columns)
            for run, ledger, record in model_runs(model_dir, points)]


def arm_runs(model_dirs, points, offset: float = 0.0) -> tuple[list, float]:
    """The runs of an arm as curves (growlm.envelope's (FLOPs + `offset`, validation loss) points at every
    evaluation: the "within one schedule" reading and the figures), and the branches' own cooldown FLOPs."""
    runs, cooldown = [], 0.0
    for d in model_dirs:
        for _, ledger, record in model_runs(d, points):
            ev = ledger.dropna(subset=["val_loss"])
            runs.append([(float(f) + offset, float(v)) for f, v in zip(ev["flops"], ev["val_loss"])])
            cooldown += float(record["cooldown_flops"]) if record else 0.0
    return runs, cooldown


# an arm's envelope of finished runs is its fitted curve L(C) = E + A C^-alpha where its ends are enough to fit three
# parameters with some to spare (growlm.multiplier.fit_power_law), else the lower hull of its ends in log FLOPs
ENVELOPE_FIT_POINTS = 5


def envelope_fit(ends: pd.DataFrame):
    """The fit that joins an arm's finished runs (`arm_ends`), or None where they are too few to fit or the fit is
    refused (the lower hull joins them then)."""
    if ends["flops"].nunique() < ENVELOPE_FIT_POINTS:
        return None
    fit = fit_power_law(ends["flops"].to_numpy(), ends["loss"].to_numpy())
    return fit if fit.ok else None


def envelope_columns(m0_dirs, m1_dirs, points: dict, *, target: float, offset: float, growth_flops: float,
                     unknown: bool) -> tuple[dict, list[dict]]:
    """The comparison's cost by envelope of finished runs (growlm.envelope.finished_reach) of one M_1 against M_0
    at M_0's final loss `target`: M_0's finished runs (`m0_dirs`, every budget's, with their branches at
    `points["baseline"]`) and M_1's (`m1_dirs`, branches at `points["refine"]`, FLOPs after `offset` - its
    members' and growth's - or after `growth_flops` alone for the members free), each arm's ends joined by its
    fitted curve or lower hull (`envelope_fit`). A point inside a run's decay is not a run that ended there: it
    counts only in the "within one schedule" columns. NaN where each arm has only one run (no branches, one
    budget: nothing ended anywhere but at the end). Also the saving at each loss both envelopes reach."""
    points = points or {}
    m0 = arm_ends(m0_dirs, points.get("baseline", {}))
    m1 = arm_ends(m1_dirs, points.get("refine", {}), 0.0 if unknown else offset)
    m1_free = m1.assign(flops=m1["flops"] - (0.0 if unknown else offset) + growth_flops)
    row = {"envelope_runs": f"{len(m0)}+{len(m1)}", "cooldown_flops": float(m0["cooldown_flops"].sum()
                                                                            + m1["cooldown_flops"].sum())}
    if len(m0) < 2 and len(m1) < 2:
        return {**row, "m0_envelope_flops": math.nan, "m1_envelope_flops": math.nan, "envelope_ratio": math.nan,
                "envelope_ratio_small_free": math.nan, "envelope_reached": False}, []
    fits = {"m0": envelope_fit(m0), "m1": envelope_fit(m1), "m1_free": envelope_fit(m1_free)}
    pairs = {name: list(zip(df["flops"], df["loss"])) for name, df in (("m0", m0), ("m1", m1), ("m1_free", m1_free))}

    def at(name: str, loss: float) -> float:
        return envelope.finished_reach(pairs[name], loss, fits[name])

    c0, c1_free = at("m0", target), at("m1_free", target)
    c1 = math.nan if unknown else at("m1", target)
    row.update(m0_envelope_flops=c0, m1_envelope_flops=c1, envelope_ratio=c1 / c0,
               envelope_ratio_small_free=c1_free / c0, envelope_reached=not math.isnan(c1_free),
               envelope_joined="fit" if fits["m0"] and fits["m1_free"] else
               ("hull" if not (fits["m0"] or fits["m1_free"]) else "fit and hull"))
    curve = []
    low, high = max(m0["loss"].min(), m1["loss"].min()), min(m0["loss"].max(), m1["loss"].max())
    steps = 25
    for i in range(steps if low < high else 0):
        loss = high - (high - low) * i / (steps - 1)
        f0, f1, f1_free = at("m0", loss), at("m1", loss), at("m1_free", loss)
        if f0 > 0 and (f1 == f1 or f1_free == f1_free):
            curve.append({"loss": loss, "m0_flops": f0, "m1_flops": f1 if not unknown else f1_free,
                          "ratio": math.nan if unknown else f1 / f0, "ratio_small_free": f1_free / f0})
    return row, curve


MULTIPLIER_COLUMNS = ("multiplier", "multiplier_low", "multiplier_high", "multiplier_free", "multiplier_free_low",
                      "multiplier_free_high", "saving", "extrapolated", "extrapolation_factor", "m0_fit_E", "m0_fit_A",
                      "m0_fit_alpha", "m0_points", "m0_seeds", "m1_seeds", "interval_method")


def multiplier_columns(table: pd.DataFrame, m0_ends: pd.DataFrame | None, *, n_boot: int = 2000) -> pd.DataFrame:
    """Each arm's effective compute multiplier with its 95% interval (growlm.multiplier.arm_multiplier), on every
    row of the arm (its seeds pooled, so the same on each), and each seed's own (`seed_multiplier`,
    `seed_multiplier_free`) on the fit of M_0's finished runs over all seeds. M_0's finished runs
    (`m0_ends`: `arm_ends` rows with the arm's keys and the seed) are every run end of every budget: its full
    runs' and its cooldown branches'. M_1's FLOPs are its whole run's with what it is charged before its
    refinement: its members and growth (counted), or the growth alone (free). Where M_0 has fewer than three
    finished runs of different FLOPs the fit is refused and the columns are empty (`m0_fit_why` says why). Where
    `table` has the columns eval_se and eval_windows (the standard error of the arm's mean final loss minus
    M_0's, read on the same windows, and their number: `eval_error`), the interval carries that evaluation's
    error too (growlm.multiplier's docstring)."""
    if table.empty:
        return table
    table = table.copy()
    for col in (*MULTIPLIER_COLUMNS, "m0_fit_why", "seed_multiplier", "seed_multiplier_free"):
        table[col] = math.nan if col not in ("saving", "interval_method", "m0_fit_why", "extrapolated") else ""
    table["extrapolated"] = False
    keys = [*M1_ARM_KEYS, "seed"]
    if m0_ends is None or m0_ends.empty:
        return table
    m0_ends = m0_ends.astype({k: str for k in keys})
    for _, g in table.groupby(list(M1_ARM_KEYS), sort=False):
        ends = m0_ends.merge(g[keys].astype(str).drop_duplicates(), how="inner", on=keys)
        ends = ends.drop_duplicates(subset=["model", "run"])  # a model's run once, whatever rows asked for it
        counted = bool((g["members_cost"] != "unknown").all())  # members of unknown cost: free only
        free = g["growth_flops"] + g["m1_refine_flops"]
        finals = pd.DataFrame({"seed": g["seed"].to_numpy(), "loss": g["m1_final_val_loss"].to_numpy(),
                               "flops": (g["small_flops"] + free if counted else free).to_numpy(),
                               "flops_free": free.to_numpy()})
        fit = fit_power_law(ends["flops"].to_numpy(), ends["loss"].to_numpy())
        table.loc[g.index, "m0_fit_why"] = fit.why
        if not fit.ok:
            continue
        paired = {}
        if "eval_se" in g and g["eval_se"].notna().all() and (g["eval_windows"] >= 2).all():  # the evaluation's error
            paired = {"eval_se": float(g["eval_se"].iloc[0]), "eval_windows": int(g["eval_windows"].iloc[0])}
        result = arm_multiplier(ends[["seed", "flops", "loss"]], finals, n_boot=n_boot, **paired)
        for col in MULTIPLIER_COLUMNS:
            if col in result:
                table.loc[g.index, col] = result[col]
        if not counted:
            table.loc[g.index, ["multiplier", "multiplier_low", "multiplier_high"]] = math.nan
        per_seed = seed_multipliers(fit, finals)
        table.loc[g.index, "seed_multiplier"] = per_seed["multiplier"].to_numpy() if counted else math.nan
        table.loc[g.index, "seed_multiplier_free"] = per_seed["multiplier_free"].to_numpy()
    return table
