"""The experiment as the config describes it: the sweep, its checks, and each job's settings.

Used by the workflow (`workflow/rules/common.smk`) to build targets and by the entry scripts to
turn config sections into a `TrainConfig`, so both agree on every value.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from growlm.methods import METHODS, members_used

if TYPE_CHECKING:  # torch; the Snakefile imports this module and should not wait for torch
    from growlm.train import TrainConfig

SWEEP_KEYS = ("d0", "L0", "d1", "L1", "n", "methods", "seeds")


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


SCHEDULES = ("vcycle", "apollo")  # training schedules that reuse no small model, not growth operators
SINGLE_MEMBER = "@m1"  # suffix of the control arm: the same operator fed m_1 alone (n copies)


def method_chain(method) -> list[str]:
    """A config method (a name, a list of names, or an id 'a+b', maybe with the control suffix)
    as a list of operator names."""
    if isinstance(method, str):
        return method.removesuffix(SINGLE_MEMBER).split("+")
    return [str(m) for m in method]


def is_single_member_control(method_id_: str) -> bool:
    return method_id_.endswith(SINGLE_MEMBER)


def needs_single_member_control(method) -> bool:
    """Whether the m_1-only control of `method` differs from the method itself: only chains with an
    operator that combines several members (concat, stack_members, ligo, mango) do; a single-source
    chain already grows m_1 alone, and the schedules (vcycle, apollo) use no member."""
    chain = method_chain(method)
    return not any(name in SCHEDULES for name in chain) and members_used(chain, 2) > 1


def method_id(method) -> str:
    """The path-safe id of a method or chain: names joined by '+'."""
    return "+".join(method_chain(method))


INT_SWEEP_KEYS = ("d0", "L0", "d1", "L1", "n", "n_members", "seeds", "budgets")
FLOAT_SWEEP_KEYS = ("lrs",)


def lr_id(lr) -> str:
    """The path-safe id of a peak learning rate: 0.002 -> '0.002', 1e-05 -> '1e-05'."""
    return f"{float(lr):g}"


def coerce_command_line(config: dict) -> None:
    """Snakemake parses list items after `--config` as strings (`d0=[32,64]` gives ['32', '64']):
    turn digit strings of the integer sweep keys into ints, in place, before validation."""
    for key in INT_SWEEP_KEYS:
        value = config.get(key)
        if isinstance(value, str) and value.strip().isdigit():
            config[key] = int(value)
        elif isinstance(value, list):
            config[key] = [int(v) if isinstance(v, str) and v.strip().isdigit() else v for v in value]
    for key in FLOAT_SWEEP_KEYS:
        value = config.get(key)
        items = value if isinstance(value, list) else [value] if isinstance(value, str) else None
        if items is None:
            continue
        coerced = []
        for v in items:
            try:
                coerced.append(float(v) if isinstance(v, str) else v)
            except ValueError:
                coerced.append(v)  # left for the schema to reject with its name
        config[key] = coerced if isinstance(value, list) else coerced[0]


def normalise_sweep(config: dict) -> dict:
    """Sweep keys as lists (a command-line `--config d0=32` gives a scalar).

    `n_members`, where given, replaces `n`: Snakemake 8.17+ rejects one-letter keys on the command
    line (`--config n=3` fails, snakemake issue #3015), so `--config n_members=3` is the way to
    sweep n from the command line.
    """
    sweep = {k: _as_list(config[k]) for k in SWEEP_KEYS}
    if config.get("n_members") is not None:
        sweep["n"] = _as_list(config["n_members"])
    sweep["budgets"] = _as_list(config.get("budgets") or config["train"]["large"]["tokens"])
    # peak learning rates of the large arms (M_0 and every M_1): each arm is tuned over this list
    sweep["lrs"] = [lr_id(v) for v in _as_list(config.get("lrs") or config["train"]["large"]["lr"])]
    if isinstance(config["methods"], list) and config["methods"] and all(
        isinstance(m, str) for m in config["methods"]
    ):
        sweep["methods"] = list(config["methods"])
    return sweep


def check_experiment(config: dict, sweep: dict) -> None:
    """Raise ValueError naming the first inconsistent setting of the sweep."""
    head_dim = config["model"]["head_dim"]
    for key in ("d0", "d1"):
        for d in sweep[key]:
            if d % head_dim:
                raise ValueError(f"{key}={d} is not a multiple of model.head_dim={head_dim}")
    for d0, d1 in itertools.product(sweep["d0"], sweep["d1"]):
        if d1 < d0:
            raise ValueError(f"d1={d1} is smaller than d0={d0}: the grown model must be at least as wide")
    for L0, L1 in itertools.product(sweep["L0"], sweep["L1"]):
        if L1 < L0:
            raise ValueError(f"L1={L1} is smaller than L0={L0}: the grown model must be at least as deep")
    for m in sweep["methods"]:
        for name in method_chain(m):
            if name in SCHEDULES:
                if len(method_chain(m)) > 1:
                    raise ValueError(f"{name} is a training schedule and cannot be chained")
                continue
            if name not in METHODS:
                raise ValueError(f"unknown growth method {name!r} in methods; known: "
                                 f"{', '.join([*METHODS, *SCHEDULES])}")
    levels = {int(s["level"]) for s in config["corpus"]["sources"]}
    for needed in (0, 1):
        if needed not in levels:
            raise ValueError(f"corpus.sources has no source of level {needed}")
    names = [s["name"] for s in config["corpus"]["sources"]]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"corpus.sources names must be unique; repeated: {', '.join(sorted(dupes))}")


STAGE_SECTIONS = {"small": ("small",), "large": ("large",), "refine": ("large", "refine")}  # of config["train"]


def train_settings(config: dict, stage: str) -> dict:
    """The part of config["train"] a job of `stage` reads: the shared keys and STAGE_SECTIONS[stage].
    The training rules declare it as params, so that Snakemake reruns a job only when a setting it
    reads changed (the members' schedule never reruns M_0)."""
    shared = {k: v for k, v in config["train"].items() if k not in ("small", "large", "refine")}
    return {**shared, **{s: config["train"].get(s) or {} for s in STAGE_SECTIONS[stage]}}


def train_config(config: dict, stage: str, *, seed: int, device: str = "cpu",
                 tokens: int | None = None, lr: float | None = None) -> TrainConfig:
    """The TrainConfig of a job of `stage` ('small', 'large' or 'refine'); `tokens` is the budget of
    a large job (the `budget` wildcard), else the stage's configured tokens; `lr` the peak learning
    rate of a large job (the `lr` wildcard), else the stage's configured one."""
    t = config["train"]
    first, *overrides = STAGE_SECTIONS[stage]  # refine: large's settings, refine's on top (not its tokens)
    base = dict(t[first])
    for section in overrides:
        base.update({k: v for k, v in (t.get(section) or {}).items() if k != "tokens"})
    if tokens is not None:
        base["tokens"] = tokens
    if lr is not None:
        base["lr"] = lr
    from growlm.train import TrainConfig

    return TrainConfig(
        tokens=int(base["tokens"]),
        batch_size=int(base.get("batch_size", 16)),
        context=int(config["model"]["context"]),
        lr=float(base["lr"]),
        warmup_steps=int(base.get("warmup_steps", 0)),
        min_lr_ratio=float(t["min_lr_ratio"]),
        weight_decay=float(t["weight_decay"]),
        grad_clip=float(t["grad_clip"]),
        eval_interval=int(t["eval_interval"]),
        eval_tokens=int(t["eval_tokens"]),
        checkpoint_every=int(t["checkpoint_every"]),
        dense_log_steps=int(t["dense_log_steps"]) if stage == "refine" else 0,
        seed=seed,
        device=device,
    )


def model_kwargs(config: dict, *, n_embd: int, n_layer: int, vocab_size: int) -> dict:
    """Keyword arguments for `growlm.model.build_model` for a model of this experiment."""
    m = config["model"]
    return dict(n_embd=n_embd, n_layer=n_layer, vocab_size=vocab_size, n_positions=m["context"],
                head_dim=m["head_dim"], tie_word_embeddings=m["tie_embeddings"])


def member_seed(seed: int, member: int) -> int:
    return 1000 * int(seed) + int(member)
