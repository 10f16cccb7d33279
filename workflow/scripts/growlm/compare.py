"""The comparison of M_0 (scratch) and each M_1 (grown from n members): accuracy and cost.

The headline is the FLOPs M_1 needs to reach M_0's final validation loss. It is reported two ways:
counting the training FLOPs of all n small members and the growth itself (the honest cost), and,
labelled as such, treating the members as free (as most papers do). Ratios are over M_0's total
training FLOPs; below 1 means growing was cheaper. The crossing point is interpolated linearly in
FLOPs between the two evaluations that bracket M_0's final loss.

When the sweep lists several peak learning rates (`lrs`) or weight decays (`weight_decays`), every arm is
tuned on its own: M_0 (per width, depth and budget) and each M_1 (per method, sizes, n and budget) are
compared at the rate and weight decay that give them the lowest mean final validation loss over the
seeds; `lr_sweep.csv` records every setting tried and the one chosen. A win against an under-tuned
baseline is no win.

Those ratios are read *within one schedule*: M_1's first crossing of M_0's final loss inside its own full
run, whose rate has not yet decayed there. Beside them, where an arm has more than one run (cooldown
branches under wsd, `train.branches`; or a sweep over `budgets`), the cost ratio *by envelope*: the FLOPs at
which the lowest loss any of M_1's runs reached first gets to M_0's final loss, over M_0's own envelope
there (growlm.envelope), with the branches' cooldown FLOPs reported as the measurement's cost, charged to
no arm; and the saving at each loss both envelopes reach (`savings.csv`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from growlm.errors import damaged, read_json
from growlm.task_scores import read_task_records, task_columns
from growlm.growth_record import Growth
from growlm.methods import OPERATORS, is_single_member_control, members_used
from growlm.modes import NOT_RECORDED, arm_mode, job_mode
from growlm.pretrained import member_cost_flops, shape_of_config
from growlm.runs import (CURVE_COLUMNS, LEDGER_NUMBERS, M1_ARM_KEYS, arm_ends, arm_runs, envelope_columns, m0_at_budget,  # noqa: F401
                         model_runs, multiplier_columns, on_curve, paired_windows, eval_error, read_ledger, run_curves,
                         run_end, tidy_run)
from growlm.tokens import load_tokens
from growlm.train_config import TrainConfig


def ledger_mode(ledger: pd.DataFrame) -> str:
    """The mode a model's ledger rows were computed in (`growlm.modes.job_mode`: two when a resume changed it)."""
    return job_mode(ledger["mode"])


def arm_modes(m1: pd.DataFrame, growth: Growth, member_ledgers: list[pd.DataFrame]) -> str:
    """The mode of an M_1 (`growlm.modes.arm_mode`): its members' training (those growlm trained), its
    schedule's stages (a schedule's growth is training) and its refinement's."""
    return arm_mode({"members": [ledger_mode(led) for led in member_ledgers],
                     "growth": [str(st.get("mode") or NOT_RECORDED) for st in growth.stages or []],
                     "refinement": [ledger_mode(m1)]})


def first_reach(ledger: pd.DataFrame, target: float, column: str = "flops") -> float:
    """The `column` value (FLOPs or wall seconds) at which val_loss first reaches `target`."""
    ev = ledger.dropna(subset=["val_loss"]).sort_values("step")
    prev = None
    for _, row in ev.iterrows():
        if row["val_loss"] <= target:
            if prev is None or prev["val_loss"] == row["val_loss"]:
                return float(row[column])
            frac = (prev["val_loss"] - target) / (prev["val_loss"] - row["val_loss"])
            return float(prev[column] + frac * (row[column] - prev[column]))
        prev = row
    return math.nan


def loss_at(ledger: pd.DataFrame, flops: float) -> float:
    """Validation loss at `flops` (linear interpolation between evaluations); NaN outside the run."""
    ev = ledger.dropna(subset=["val_loss"]).sort_values("flops")
    if flops < ev["flops"].iloc[0] or flops > ev["flops"].iloc[-1]:
        return math.nan
    return float(np.interp(flops, ev["flops"], ev["val_loss"]))


def unigram_loss(train_tokens: np.ndarray, test_tokens: np.ndarray, vocab_size: int) -> float:
    """Cross entropy of an add-one unigram model: the floor any real model must beat."""
    counts = np.bincount(np.asarray(train_tokens, dtype=np.int64), minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[np.asarray(test_tokens, dtype=np.int64)].mean())


def _metrics(path: Path, level: str = "1") -> dict:
    m = read_json(path).get("levels")
    if not isinstance(m, dict):
        raise damaged(path, "no per-level metrics")
    return m.get(level, {})


def final_val_loss(model_dir: str | Path) -> float:
    """The validation loss of the last evaluation (NaN if it was not finite or there was none)."""
    led = read_ledger(Path(model_dir) / "ledger.csv")
    ev = led[led["kind"] == "eval"] if "kind" in led else led
    return float(ev["val_loss"].iloc[-1]) if len(ev) else math.nan


def priced(member: dict, pretrained: dict | None) -> dict:
    """A member's entry of growth.json with its training cost: a pretrained member (growlm did not train
    it) costs what `members.cost` states, as the FLOPs of its own shape (`growlm.pretrained.member_cost_flops`),
    or is unknown (flops None). `pretrained`: {"cost": members.cost, "context": model.context, "sources":
    members.pretrained}, which the rules that price members (compare, report_tasks, a refinement's live
    curves) pass; the import and grow jobs never read members.cost, so stating it reruns only these."""
    if not member.get("pretrained"):
        return member
    cost = (pretrained or {}).get("cost")
    flops = None
    if cost:
        shape = shape_of_config(read_json(Path(member["dir"]) / "config.json"), str(member["dir"]))
        flops = member_cost_flops(cost, shape, int(pretrained["context"]))
    return {**member, "flops": flops, "cost": "stated" if flops is not None else "unknown"}


def growth_cost(growth: Growth, pretrained: dict | None = None) -> dict:
    """What M'_1 cost before its refinement, from its grow job's `growth.json`: the members the method
    used (a chain of single-source operators grows m_1 alone; a plugin's job trims its own list) and
    the members' shared trunk (`members.trunk`, counted once), their training FLOPs and wall time,
    and the growth's own. `members` lists the members used, then the trunk; `n_members` counts the
    members only. M_1's curve starts at `small_flops + growth_flops`. A pretrained member's training
    cost is what `members.cost` stated (`priced`), or unknown (None): then `unknown` is True and
    `small_flops` NaN (not counted)."""
    trunk = [m for m in growth.members if m.get("role") == "trunk"]
    members = [priced(m, pretrained) for m in growth.members if m.get("role") != "trunk"]
    if growth.chain and all(nm in OPERATORS for nm in growth.chain):
        members = members[:members_used(growth.chain, len(members))]
    used = members + trunk
    unknown = any(m.get("flops") is None for m in used)
    return {"members": used, "n_members": len(members), "unknown": unknown,
            "small_flops": math.nan if unknown else float(sum(m["flops"] for m in used)),
            "small_wall_s": float(sum(m.get("wall_s") or 0.0 for m in used)),
            "growth_flops": float(growth.growth_flops), "growth_wall_s": float(growth.growth_wall_s)}


def members_described(growth: Growth, pretrained: dict | None = None) -> dict:
    """What the members an arm used are, as the comparison and the report describe them: trained by growlm
    (their shape is the config's d0 and L0) or trained elsewhere (`members.pretrained`: their own family
    and shape and dtype, read from the imported folders, and where they are now: `pretrained["sources"]`,
    the config's entries, since a member moved with the same content is not imported again)."""
    used = [m for m in growth_cost(growth, pretrained)["members"] if m.get("role") != "trunk"]
    metas = []
    for m in used:
        meta_file = Path(m["dir"]) / "growlm.json"
        metas.append(read_json(meta_file) if meta_file.is_file() else {})
    brought = bool(used) and any(meta.get("role") == "pretrained member" for meta in metas)
    shapes, sources, dtypes = [], [], []
    for m, meta in zip(used, metas):
        config = Path(m["dir"]) / "config.json"
        if config.is_file():
            s = shape_of_config(read_json(config), str(m["dir"]))
            shapes.append(f"{s.family}, width {s.d}, {s.L} layer{'s' if s.L != 1 else ''}")
        if brought:
            sources.append(_source_of(m["dir"], meta, pretrained))
            dtypes.append(str(meta.get("source_dtype") or "float32"))
    return {"members_origin": "trained elsewhere" if brought else ("trained by growlm" if used else ""),
            "members_shape": "; ".join(dict.fromkeys(shapes)), "members_source": "; ".join(sources),
            "members_dtype": "; ".join(dict.fromkeys(dtypes))}


def schedule_of(model_dir: Path) -> str:
    """The learning-rate schedule a model was trained with, in words (`TrainConfig.schedule_text`), from
    its growlm.json; empty for a folder without one."""
    meta = Path(model_dir) / "growlm.json"
    config = (read_json(meta).get("train") or {}).get("config") if meta.is_file() else None
    return TrainConfig.from_dict(config).schedule_text() if config else ""


def members_schedule(members: list[dict]) -> str:
    """The learning-rate schedules of the members an arm used (its trunk's included), each once: read from their
    folders like M_0's and M_1's, so that the comparison says what the members are, not what the config asks."""
    return "; ".join(dict.fromkeys(s for m in members if (s := schedule_of(m["dir"]))))


def grown_from(growth: Growth) -> str:
    """Which model of each member the growth read (`members.source`): 'annealed', or 'before decay (step k
    of K)' for members read where their wsd decay began (`growlm.runner.save_before_decay`)."""
    points = []
    for m in growth_cost(growth)["members"]:
        meta = Path(m["dir"]) / "growlm.json"
        where = read_json(meta).get("before_decay") if meta.is_file() and m.get("role") != "trunk" else None
        if where:
            points.append(f"step {where['step']} of {where['of']}")
    return f"before decay ({', '.join(dict.fromkeys(points))})" if points else "annealed"


def tokens_per_param(budget: int, model_dir: Path) -> dict:
    """M_0's budget in tokens per parameter, non-embedding (Kaplan et al.'s count, the one scaling laws and
    most growth papers state) and total, so that a saving can be set beside the published ones."""
    shape = shape_of_config(read_json(Path(model_dir) / "config.json"), str(model_dir))
    return {"tokens_per_param": budget / (shape.n_params - shape.embedding_params),
            "tokens_per_param_total": budget / shape.n_params}
def _source_of(member_dir, meta: dict, pretrained: dict | None) -> str:
    """Where a pretrained member lies: its entry of members.pretrained (the folder models/pretrained/m2 is
    entry 2), else where the import read it."""
    entries = (pretrained or {}).get("sources") or []
    number = Path(member_dir).name.removeprefix("m")
    if number.isdigit() and 0 < int(number) <= len(entries):
        entry = entries[int(number) - 1]
        return str(entry if isinstance(entry, str) else entry.get("path") or entry.get("hf"))
    return str((meta.get("source") or {}).get("where", member_dir))


def weight_decay_of(model_dir: Path) -> float:
    """The weight decay a model was trained with, from its growlm.json (NaN for a folder without one)."""
    meta = Path(model_dir) / "growlm.json"
    config = (read_json(meta).get("train") or {}).get("config") if meta.is_file() else None
    return float(config["weight_decay"]) if config else math.nan


def passes(budget: int, members: list[dict], token_files: dict | None) -> dict:
    """How many times the large arms read their training text (M_0's budget over its tokens: the epochs
    behind its tokens per parameter), and how many times a member read its own (its shard or cluster
    where the members split the text), from the token files (`token_files`: {"large", "members"})."""
    if not token_files:
        return {}
    out = {"m0_passes": budget / max(1, load_tokens(token_files["large"]).size)}
    trained = [m for m in members if m.get("role") != "trunk" and (Path(m["dir"]) / "growlm.json").is_file()]
    meta = read_json(Path(trained[0]["dir"]) / "growlm.json") if trained else {}
    tokens = (meta.get("train") or {}).get("tokens")
    if tokens and meta.get("role") != "pretrained member":
        shard = meta.get("shard")
        parts = (shard["count"] if isinstance(shard, dict) else shard[1]) if shard else 1
        out["members_passes"] = float(tokens) / max(1, load_tokens(token_files["members"]).size / parts)
    return out


M0_ARM_KEYS = ("d1", "L1", "budget")


def choose_learning_rates(combos: list[dict], paths: dict) -> tuple[dict, dict, pd.DataFrame]:
    """The peak learning rate (and weight decay: the `lr` values are optimizer ids, growlm.experiment.optim_id)
    of each arm: the one with the lowest final validation loss averaged over the seeds (a rate whose run
    ended non-finite never wins). Returns the M_0 choices keyed by
    (d1, L1, budget), the M_1 choices keyed by (method, d0, L0, d1, L1, n, budget), and the table
    of every (arm, lr) with its mean loss and whether it was chosen."""
    rows, seen = [], set()
    for c in combos:
        for arm, keys, pattern in (("M_0", M0_ARM_KEYS, "baseline"), ("M_1", M1_ARM_KEYS, "refined")):
            d = paths[pattern].format(**c)
            if d in seen:
                continue
            seen.add(d)
            # keys as strings; M_0 does not depend on the members, so its d0, L0, n stay empty
            rows.append({"arm": arm, "method": c["method"] if arm == "M_1" else "scratch",
                         **{k: str(c[k]) if k in keys else "" for k in M1_ARM_KEYS if k != "method"},
                         "lr": str(c["lr"]), "weight_decay": weight_decay_of(d), "seed": c["seed"],
                         "final_val_loss": final_val_loss(d)})
    runs = pd.DataFrame(rows)
    table = (runs.groupby(["arm", "method", "d0", "L0", "d1", "L1", "n", "budget", "lr", "weight_decay"], dropna=False)
             .agg(seeds=("seed", "nunique"), mean_final_val_loss=("final_val_loss", "mean"),
                  std_final_val_loss=("final_val_loss", "std")).reset_index())
    table["chosen"] = False
    choices = {"M_0": {}, "M_1": {}}
    for (arm, *_), g in table.groupby(["arm", "method", "d0", "L0", "d1", "L1", "n", "budget"]):
        finite = g[np.isfinite(g["mean_final_val_loss"])]
        best = (finite if len(finite) else g).sort_values(["mean_final_val_loss", "lr"]).index[0]
        table.loc[best, "chosen"] = True
        row = table.loc[best]
        keys = M0_ARM_KEYS if arm == "M_0" else M1_ARM_KEYS
        choices[arm][tuple(row[k] for k in keys)] = row["lr"]
    return choices["M_0"], choices["M_1"], table


def arm_key(combo: dict, keys: tuple[str, ...]) -> tuple:
    return tuple(str(combo[k]) for k in keys)


DEFAULT_LEVELS = {"members": ["0"], "large": ["1"], "evaluate": "1"}


def compare_one(combo: dict, paths: dict, *, m0_lr=None, levels: dict | None = None,
                tasks: dict | None = None, pretrained: dict | None = None, envelope_dirs: dict | None = None,
                branches: dict | None = None, token_files: dict | None = None) -> tuple[dict, list[pd.DataFrame]]:
    """M_0 at learning rate `m0_lr` (the combo's own `lr` if None; an optimizer id, growlm.experiment.optim_id)
    against M_1 at the combo's `lr`; test metrics on `levels["evaluate"]` (growlm.experiment.arm_levels);
    with `tasks` (`read_task_records`), their lm-evaluation-harness scores, M_1's beside M_0's; `pretrained`:
    the members brought (`priced`). `envelope_dirs`: {"m0": [...], "m1": [...]}, the arms' model folders
    at every budget of the sweep (each at its chosen setting), with cooldown branches at `branches`, for
    the cost by envelope (`envelope_columns`; the rows of the saving at each loss under "savings");
    `token_files`: the large arms' and the members' training tokens, for the passes over them."""
    levels = levels or DEFAULT_LEVELS
    m0_lr = combo["lr"] if m0_lr is None else m0_lr
    base_dir = Path(paths["baseline"].format(**{**combo, "lr": m0_lr}))
    ref_dir = Path(paths["refined"].format(**combo))
    grown_dir = Path(paths["grown"].format(**combo))
    growth = Growth.read(grown_dir)
    cost = growth_cost(growth, pretrained)
    used, n_members = cost["members"], cost["n_members"]
    small_flops, small_wall = cost["small_flops"], cost["small_wall_s"]
    growth_flops, growth_wall = cost["growth_flops"], cost["growth_wall_s"]
    unknown = cost["unknown"]

    m0 = m0_at_budget(base_dir, int(combo["budget"]))
    m1 = read_ledger(ref_dir / "ledger.csv")
    m0_final = float(m0.dropna(subset=["val_loss"])["val_loss"].iloc[-1])
    m1_final = float(m1.dropna(subset=["val_loss"])["val_loss"].iloc[-1])
    # wall-clock ratios compare training time with training time: compilation left out on both sides
    # (docs/results.md)
    m0_flops, m0_wall = float(m0["flops"].iloc[-1]), float(m0["train_wall_s"].iloc[-1])
    # within one schedule, like with like: M_1's curve against M_0's, each on the evaluations' own windows (a
    # run's last row reads the whole validation split, `val_loss`, with the curve's point beside it)
    m0_curve, m1_curve = on_curve(m0), on_curve(m1)
    m0_curve_final = float(m0_curve.dropna(subset=["val_loss"])["val_loss"].iloc[-1])
    reach_flops = first_reach(m1_curve, m0_curve_final, "flops")
    reach_wall = first_reach(m1_curve, m0_curve_final, "train_wall_s")
    offset = small_flops + growth_flops

    def metric(d: Path, key: str) -> float:
        p = Path(str(d).replace("/models/", "/eval/", 1)) / "metrics.json"  # results[/NAME]/eval/...
        return float(_metrics(p, levels["evaluate"]).get(key, math.nan))

    row = {
        **{k: v for k, v in combo.items() if k != "lr"},
        "members_used": n_members,
        "m0_lr": str(m0_lr).partition("_wd")[0],
        "m1_lr": str(combo["lr"]).partition("_wd")[0],
        "m0_weight_decay": weight_decay_of(base_dir),
        "m1_weight_decay": weight_decay_of(ref_dir),
        **tokens_per_param(int(combo["budget"]), base_dir),
        **passes(int(combo["budget"]), used, token_files),
        "m0_schedule": schedule_of(base_dir),
        "m1_schedule": schedule_of(ref_dir),
        "members_schedule": members_schedule(used),
        "members_grown_from": grown_from(growth) if used else "",
        "m0_final_val_loss": m0_final,
        "m1_final_val_loss": m1_final,
        "m0_final_val_loss_se": run_end(m0)["loss_se"],
        "m1_final_val_loss_se": run_end(m1)["loss_se"],
        "m1_step0_val_loss": float(m1.dropna(subset=["val_loss"])["val_loss"].iloc[0]),
        "m0_test_loss": metric(base_dir, "loss"),
        "m1_test_loss": metric(ref_dir, "loss"),
        "m0_test_ppl": metric(base_dir, "perplexity"),
        "m1_test_ppl": metric(ref_dir, "perplexity"),
        "m0_test_acc": metric(base_dir, "accuracy"),
        "m1_test_acc": metric(ref_dir, "accuracy"),
        "small_flops": small_flops,
        "growth_flops": growth_flops,
        "m0_flops": m0_flops,
        "m1_refine_flops": float(m1["flops"].iloc[-1]),
        "m1_flops_to_m0_loss": reach_flops,
        "cost_ratio": (offset + reach_flops) / m0_flops,
        "cost_ratio_small_free": (growth_flops + reach_flops) / m0_flops,
        "wall_ratio": (small_wall + growth_wall + reach_wall) / m0_wall,
        "wall_ratio_small_free": (growth_wall + reach_wall) / m0_wall,
        "loss_gap_equal_flops": math.nan if unknown else loss_at(m1_curve, m0_flops - offset) - m0_curve_final,
        "m0_peak_mem_mb": float(m0["peak_mem_mb"].max()),
        "m1_peak_mem_mb": float(m1["peak_mem_mb"].max()),
        "reached": not math.isnan(reach_flops),
        # how the members' training is counted: growlm trained them; members.cost stated it; unknown
        "members_cost": "unknown" if unknown else ("stated" if any(m.get("cost") == "stated" for m in used)
                                                   else "counted"),
        **members_described(growth, pretrained),
    }
    if row["members_origin"] == "trained elsewhere":  # their wall time is not known: no wall ratio counts it
        row["wall_ratio"] = math.nan
    dirs = envelope_dirs or {"m0": [base_dir], "m1": [ref_dir]}
    columns, saving = envelope_columns(dirs["m0"], dirs["m1"], branches or {}, target=m0_final, offset=offset,
                                       growth_flops=growth_flops, unknown=unknown)
    row.update(columns)
    row["savings"] = saving
    if tasks:
        m0_tasks = task_columns(tasks.get(os.path.normpath(base_dir), []))
        m1_tasks = task_columns(tasks.get(os.path.normpath(ref_dir), []))
        for col in dict.fromkeys([*m0_tasks, *m1_tasks]):
            row[f"m0_{col}"], row[f"m1_{col}"] = m0_tasks.get(col, math.nan), m1_tasks.get(col, math.nan)
    if paths.get("ensemble"):
        ens = Path(paths["ensemble"].format(**combo))
        row["ensemble_test_loss"] = float(_metrics(ens, levels["evaluate"]).get("loss", math.nan))
    if is_single_member_control(combo["method"]):
        row["arm"] = "control: m_1 only"
    elif not used:
        row["arm"] = "schedule (no small model)"
    elif len(used) == 1 and int(combo["n"]) > 1:
        row["arm"] = "grown from m_1 (single-source operator)"
    else:
        row["arm"] = "grown from n members"
    keys = {k: combo[k] for k in ("d0", "L0", "d1", "L1", "n", "method", "seed", "budget")}
    points = branches or {}
    curves = run_curves(base_dir, points.get("baseline", {}), offset=0.0, arm="M_0 (scratch)", lr=m0_lr, **keys)
    # with the members' cost unknown the curve starts at the growth's cost (members free, as the row says)
    curves += run_curves(ref_dir, points.get("refine", {}), offset=growth_flops if unknown else offset,
                         arm=f"M_1 ({combo['method']})", lr=combo["lr"], **keys)
    member_ledgers = []
    for i, member in enumerate(used, start=1):
        if not (Path(member["dir"]) / "ledger.csv").is_file():  # a pretrained member: not trained here
            continue
        led = read_ledger(Path(member["dir"]) / "ledger.csv")
        member_ledgers.append(led)
        curves.append(tidy_run(led, None, arm=f"m_{i} (small, level {'+'.join(levels['members'])})", offset=0.0,
                               **keys))
    # how each arm's numbers were computed (growlm.modes: compile and CPU threads change the last digits)
    row["m0_mode"], row["m1_mode"] = ledger_mode(m0), arm_modes(m1, growth, member_ledgers)
    return row, curves


def write_comparison(combos: list[dict], paths: dict, *, comparison_csv, curves_csv, unigram_train,
                     unigram_test, vocab_size: int, lr_sweep_csv=None, levels: dict | None = None,
                     task_files=None, pretrained: dict | None = None, branches: dict | None = None,
                     savings_csv=None, token_files: dict | None = None) -> pd.DataFrame:
    uni = unigram_loss(load_tokens(unigram_train), load_tokens(unigram_test), vocab_size)
    tasks = read_task_records(task_files)
    m0_lrs, m1_lrs, sweep = choose_learning_rates(combos, paths)
    if lr_sweep_csv is not None:
        sweep.to_csv(lr_sweep_csv, index=False)
    budgets = sorted({c["budget"] for c in combos}, key=int)

    def at_every_budget(combo, pattern, keys, chosen):  # an arm's models at every budget, each at its best setting
        out = []
        for b in budgets:
            key = arm_key({**combo, "budget": b}, keys)
            if key in chosen:
                out.append(Path(paths[pattern].format(**{**combo, "budget": b, "lr": chosen[key]})))
        return out

    rows, curves, savings, m0_ends, differences, row_keys = [], [], [], [], {}, []
    for combo in combos:
        if str(combo["lr"]) != m1_lrs[arm_key(combo, M1_ARM_KEYS)]:
            continue  # each arm is compared at its own best rate
        dirs = {"m0": at_every_budget(combo, "baseline", M0_ARM_KEYS, m0_lrs),
                "m1": at_every_budget(combo, "refined", M1_ARM_KEYS, m1_lrs)}
        m0_ends.append(arm_ends(dirs["m0"], (branches or {}).get("baseline", {})).assign(
            **{k: combo[k] for k in M1_ARM_KEYS}, seed=combo["seed"]))
        differences.setdefault(arm_key(combo, M1_ARM_KEYS), []).append(  # M_1 less M_0's nearest run, per window
            paired_windows(paths["refined"].format(**combo), dirs["m0"], (branches or {}).get("baseline", {})))
        row, c = compare_one(combo, paths, m0_lr=m0_lrs.get(arm_key(combo, M0_ARM_KEYS)), levels=levels,
                             tasks=tasks, pretrained=pretrained, envelope_dirs=dirs, branches=branches,
                             token_files=token_files)
        row["unigram_test_loss"] = uni
        row["test_level"] = (levels or DEFAULT_LEVELS)["evaluate"]
        keys = {k: combo[k] for k in ("d0", "L0", "d1", "L1", "n", "method", "seed", "budget")}
        savings += [{**keys, **r} for r in row.pop("savings")]
        rows.append(row)
        row_keys.append(arm_key(combo, M1_ARM_KEYS))
        curves.extend(c)
    table = pd.DataFrame(rows)
    if len(table):  # each arm's evaluation error, the seeds' mean difference to M_0 on the same windows
        errors = {key: eval_error(d) for key, d in differences.items()}
        table["eval_se"] = [errors[k][0] for k in row_keys]
        table["eval_windows"] = [errors[k][1] for k in row_keys]
    table = multiplier_columns(table, pd.concat(m0_ends, ignore_index=True) if m0_ends else None)
    table.to_csv(comparison_csv, index=False)
    if savings_csv is not None:
        pd.DataFrame(savings, columns=[*("d0", "L0", "d1", "L1", "n", "method", "seed", "budget"), "loss", "m0_flops",
                                       "m1_flops", "ratio", "ratio_small_free"]).to_csv(savings_csv, index=False)
    curve_df = pd.concat(curves, ignore_index=True)
    curve_df["total_flops"] = curve_df["flops"] + curve_df["offset_flops"]
    first = [c for c in CURVE_COLUMNS if c in curve_df]  # the tidy columns first, the ledger's others after
    curve_df[[*first, *(c for c in curve_df if c not in first)]].to_csv(curves_csv, index=False)
    print(table.T.to_string())
    return table
