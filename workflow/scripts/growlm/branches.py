"""Cooldown branches: where each wsd large run branches, what each branch runs, and M_0's finished runs.

A cooldown branch is a finished run of a shorter budget (growlm.envelope): the full run's state at a point of
its stable phase, decayed over the shorter run's own share (`TrainConfig.branch`). For the envelope to be made
of runs that a user could have planned, a branch must be *the run planned for its own budget*, for every
setting the config resolves against a budget. So a branch's settings are resolved as the refine job's are, at
the branch's budget, as if that budget were one of the sweep's (`refine_branch`):

* a refiner's step count or a mask ramp given as a share (`teach_steps: 0.1`, `ramp_steps: 0.2`) is that
  share of the branch's steps; one given in steps keeps its count, capped at the branch's length as any
  refinement's is (a ramp too: it then ends with the branch);
* an unconfigured one, a fifth of the sweep's shortest refinement (`growlm.methods.REFINE_SHARE`), is a fifth
  of the shorter of that and the branch: the default a sweep with the branch's budget in it would give;
* a schedule's last stage warms up over its `final_warmup` share of the branch's steps.

Where the branch's settings so resolved are the full run's (the same refiners and ramps, the same training
settings but the budget), the branch continues the state the full run kept at its point: every step before it
is the same step under both. Where they differ, the branch's first steps are not the full run's, so it runs
from the start (from M'_1 at step 0) as its own run; its branch.json says so (`from_start`) and its whole
cost is the measurement's (`cooldown_flops`). docs/methods.md states the rule.

M_0 has no refiners: its branches always continue its state. `baseline.extend` E > 1 trains it E times its
budget, and its points (`growlm.experiment.branch_points`) are shares of the stable phase of its run *of the
budget*, so a branch at f ends near f times the budget, and the one at 1 is the run of exactly the budget
(`baseline_branch`); `baseline_ends` lists every finished run of an M_0 folder.

Torch-free (the Snakefile's params and the config check use it).
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

from growlm.errors import GrowlmError
from growlm.experiment import (baseline_extend, branch_points, canonical, large_settings, refine_operators,
                               refine_ramps, refine_settings)
from growlm.methods import OPERATORS, SCHEDULE, method_id
from growlm.train_config import TrainConfig


def baseline_branch(config: dict, *, seed: int, budget: int, optim: str, fraction: float) -> dict:
    """The cooldown branch of M_0 at `fraction` of the stable phase of its run of `budget` tokens (the rule's
    params; branch.json records it): {"fraction", "step" (where it leaves M_0's run), "steps", "tokens" (its
    length), "budget", "at_budget" (whether it is the run of exactly the budget), "from_start": False}. M_0's
    run is `baseline.extend` times the budget; its branch at 1 is the budget's own run, of exactly its steps
    (`TrainConfig.branch`'s `steps`), the others the shortest run that decays from their step, as without
    extend. Raises GrowlmError for a point outside M_0's stable phase."""
    full = TrainConfig.from_dict(large_settings(config, seed=seed, tokens=int(budget), optim=optim))
    own = full.with_(tokens=int(budget))  # the run of the budget, whose stable phase the points are shares of
    if full.schedule != "wsd":
        raise GrowlmError("cooldown branches need the wsd schedule (train.schedule: wsd)")
    step = int(round(float(fraction) * own.decay_start))
    if not own.warmup_steps <= step < full.decay_start:
        raise GrowlmError(f"M_0's branch at {float(fraction):g} of its budget's stable phase leaves its run at step "
                          f"{step}, outside its stable phase (steps {own.warmup_steps} to {full.decay_start - 1})")
    cfg = full.branch(step, own.steps if float(fraction) == 1 else None)
    return {"fraction": float(fraction), "step": step, "steps": cfg.steps, "tokens": cfg.steps * _per_step(cfg),
            "budget": int(budget), "at_budget": cfg.steps == own.steps, "from_start": False}


def refine_branch(config: dict, method: str, *, seed: int, budget: int, lr, fraction: float,
                  budgets: list[int]) -> dict:
    """The cooldown branch of `method`'s refinement at `budget` (a sweep of `budgets`) at `fraction` of its
    stable phase, as the rule's params: `baseline_branch`'s keys, and the run planned for the branch's budget
    (`train`, `ramps`, `refine_with`, resolved as the refine job's are: the module docstring), `from_start`
    (whether they differ from the full run's before the branch point) and `differs` (what differs, in words)."""
    full = TrainConfig.from_dict(refine_settings(config, method, seed=seed, tokens=int(budget), lr=lr))
    step = full.branch_step(float(fraction))
    short = full.branch(step)
    steps, tokens = short.steps, short.steps * _per_step(short)
    spec = OPERATORS.get(method)
    if spec is not None and spec.axis == SCHEDULE and "final_share" in spec.options:
        # a schedule's last stage is a share of the arm's budget (growlm.recipes.refine_recipe): the branch is
        # that stage shortened, warming up over the same share of its own steps
        opts = {**spec.options, **(config.get(method) or {})}
        warmup = float(opts["final_warmup"]) if "final_warmup" in opts else 0.0  # a schedule without it: none
        train = {**short.run_settings(), "warmup_steps": int(round(warmup * steps))}
    else:
        train = refine_settings(config, method, seed=seed, tokens=tokens, lr=lr)
    planned = [*budgets, tokens]  # as if the branch's budget were one of the sweep's
    ramps = {k: min(int(v), steps) for k, v in refine_ramps(config, method, budgets=planned, budget=tokens).items()}
    ops = {name: _capped(name, opts, steps)
           for name, opts in refine_operators(config, method, budgets=planned, budget=tokens).items()}
    full_ramps = refine_ramps(config, method, budgets=budgets, budget=int(budget))
    full_ops = refine_operators(config, method, budgets=budgets, budget=int(budget))
    differs = [f"{k} ({a} and {b})" for k, a, b in _changes(short.run_settings(), train)]
    differs += [f"mask ramp {k} ({a} and {b} steps)" for k, a, b in _changes(full_ramps, ramps)]
    for name in dict.fromkeys([*full_ops, *ops]):
        mine, theirs = ops.get(name) or {}, _capped(name, full_ops.get(name), full.steps)
        differs += [f"{name}'s {k} ({a} and {b})" for k, a, b in _changes(theirs, mine)]
    return canonical({"fraction": float(fraction), "step": step, "steps": steps, "tokens": tokens,
                      "budget": int(budget), "at_budget": steps == full.steps, "from_start": bool(differs),
                      "differs": differs, "train": train, "ramps": ramps, "refine_with": ops})


def _per_step(cfg: TrainConfig) -> int:
    return cfg.batch_size * cfg.context


def _capped(name: str, options: dict | None, steps: int) -> dict:
    """A refiner's options with its step counts held within a run of `steps` steps, as its `settings` holds them
    (growlm.refiners.Refiner.settings): what the run computes."""
    if options is None:
        return {}
    return {k: (min(int(v), steps) if k in OPERATORS[name].ramps else v) for k, v in options.items()}


def _changes(a: dict, b: dict) -> list[tuple]:
    """(key, a's, b's) for every key whose value differs, `tokens` aside (the budget: what a branch changes)."""
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if k != "tokens" and a.get(k) != b.get(k)]


def kept_steps(config: dict, kind: str, *, seed: int, budget: int, lr: str, method: str | None = None,
               points: dict | None = None) -> dict:
    """{point: step} where a large job (`kind` "baseline": M_0; "refine": `method`'s refinement) keeps its state
    for its cooldown branches (`points`: {point: fraction}, by default all of the stage's)."""
    stage = "large" if kind == "baseline" else "refine"
    points = branch_points(config, stage) if points is None else points
    if kind == "baseline":
        return {p: baseline_branch(config, seed=seed, budget=budget, optim=lr, fraction=f)["step"]
                for p, f in points.items()}
    full = TrainConfig.from_dict(refine_settings(config, method, seed=seed, tokens=int(budget), lr=lr))
    return {p: full.branch_step(f) for p, f in points.items()}


def branch_problems(config: dict, sweep: dict) -> list[str]:
    """Why the config's cooldown branches cannot run, one line each (growlm.validate, before any job):
    `baseline.extend` under the cosine, a point of M_0 at or past its extended run's decay, or any branch
    outside its run's stable phase (a point in the warm-up)."""
    out, seed, extend = [], sweep["seeds"][0], baseline_extend(config)
    m0 = TrainConfig.from_dict(large_settings(config, seed=seed, tokens=int(sweep["budgets"][0]),
                                              optim=sweep["optims"][0]))
    if extend > 1 and m0.schedule != "wsd":
        return [f"baseline.extend = {extend:g}: M_0 trains under the cosine, whose decay is planned for its whole "
                "run, so it has no run that ends at its budget to branch; set train.schedule (or "
                "train.large.schedule) to wsd, or baseline.extend to 1"]
    past = [f for f in config["train"]["branches"] if float(f) >= extend]
    if past and m0.schedule == "wsd":
        return [f"train.branches = {float(past[0]):g}: a point at or past M_0's budget needs M_0 trained beyond it "
                f"(baseline.extend above {float(past[0]):g}, now {extend:g})"]
    for budget, optim in itertools.product(sweep["budgets"], sweep["optims"][:1]):
        for fraction in branch_points(config, "large").values():
            try:
                baseline_branch(config, seed=seed, budget=int(budget), optim=optim, fraction=fraction)
            except GrowlmError as err:
                out.append(f"train.branches = {fraction:g}: M_0, budget {budget}: {err}; drop that point or shorten "
                           "the warm-up")
        for method in dict.fromkeys(method_id(m) for m in sweep["methods"]):
            for fraction in branch_points(config, "refine").values():
                try:
                    refine_branch(config, method, seed=seed, budget=int(budget), lr=optim, fraction=fraction,
                                  budgets=sweep["budgets"])
                except GrowlmError as err:
                    out.append(f"train.refine.branches = {fraction:g}: {method}, budget {budget}: {err}; drop that "
                               "point or shorten the warm-up")
    return out


def baseline_ends(model_dir, *, budget: int) -> list[dict]:
    """Every finished run of the M_0 model folder `model_dir` (trained at `budget` tokens, maybe
    `baseline.extend` times over): its full run and each cooldown branch found in its `branches/` folder, in
    order of tokens. Each: {"run": "full" or the branch's point id ("100"), "fraction" (None for the full run),
    "steps", "tokens", "flops" (what the run cost from step 0: a branch's includes the steps it shares with the
    full run), "final_val_loss" (its last evaluation), "at_budget" (True for the one run of exactly the
    budget's steps: the full run where M_0 is not extended, else its branch at 1), "ledger" (its ledger's
    path)}. What the comparison reads for M_0's final loss at the budget is the row with `at_budget`."""
    model_dir = Path(model_dir)
    meta = json.loads((model_dir / "growlm.json").read_text())["train"]
    cfg = TrainConfig.from_dict(meta["config"])
    own = cfg.with_(tokens=int(budget)).steps
    out = [{"run": "full", "fraction": None, "steps": cfg.steps, "tokens": cfg.steps * _per_step(cfg),
            "flops": float(meta["flops"]), "final_val_loss": _last_loss(model_dir / "ledger.csv"),
            "at_budget": cfg.steps == own, "ledger": str(model_dir / "ledger.csv")}]
    for record in sorted((model_dir / "branches").glob("b*/branch.json")):
        b = json.loads(record.read_text())
        out.append({"run": record.parent.name[1:], "fraction": float(b["fraction"]), "steps": int(b["steps"]),
                    "tokens": int(b["tokens"]), "flops": float(b["flops"]), "final_val_loss": float(b["final_val_loss"]),
                    "at_budget": int(b["steps"]) == own, "ledger": str(record.parent / "ledger.csv")})
    return sorted(out, key=lambda r: r["tokens"])


def _last_loss(ledger: Path) -> float:
    """The last validation loss of a ledger (its last row that has one)."""
    with open(ledger, newline="") as f:
        losses = [row["val_loss"] for row in csv.DictReader(f) if row.get("val_loss") not in (None, "")]
    return float(losses[-1])
