"""The experiment as the config describes it: the sweep, its checks, and what each job reads.

The workflow (`workflow/rules/*.smk`) imports this module while Snakemake parses the Snakefile,
so it is torch-free. It turns the validated config into

* the sweep: every (d0, L0, d1, L1, n, method, seed, budget, lr) combination (`normalise_sweep`);
* (the checks that stop a bad experiment before any job runs are in `growlm.validate`);
* each job's settings, resolved from the config sections it depends on (`train_settings`,
  `model_settings`, `grow_settings`, ...). The rules declare exactly these as `params`, and the
  entry scripts pass only them (with the rule's wildcards, inputs and outputs) to the job functions
  in `growlm.jobs`: a job reads nothing that its rule does not declare, so Snakemake reruns a job
  exactly when something it reads changed.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from growlm.envelope import point_id
from growlm.family_specs import DEFAULT_FAMILY, family_spec
from growlm.methods import OPERATORS, REFINE_SHARE, check_options, growth_names, method_chain, refine_names
from growlm.recipes import grow_recipe, refine_recipe
from growlm.outputs import results_dir
from growlm.train_config import BEFORE_DECAY, TrainConfig

SWEEP_KEYS = ("d0", "L0", "d1", "L1", "n", "methods", "seeds")
STAGE_SECTIONS = {"small": ("small",), "large": ("large",), "refine": ("large", "refine")}  # of config["train"]


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def lr_id(lr) -> str:
    """The path-safe id of a peak learning rate: 0.002 -> '0.002', 1e-05 -> '1e-05'."""
    return f"{float(lr):g}"


def optim_id(lr, weight_decay, default_weight_decay) -> str:
    """The path-safe id of a large run's optimizer settings (the `lr` wildcard): its peak rate, with
    `_wd<x>` where its weight decay is not the config's `train.weight_decay` - so that a run of the default
    weight decay keeps the path (and the results) it had before weight decay could be swept."""
    wd = float(weight_decay)
    return lr_id(lr) if wd == float(default_weight_decay) else f"{lr_id(lr)}_wd{wd:g}"


def parse_optim(text: str) -> tuple[float, float | None]:
    """(peak rate, weight decay or None for the config's) of an `optim_id`."""
    lr, _, wd = str(text).partition("_wd")
    return float(lr), (float(wd) if wd else None)


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
    # ... and their weight decays (weight_decays): each arm is tuned over every (rate, weight decay), whose ids
    # (`optim_id`) are the `lr` wildcard's values
    default_wd = config["train"]["weight_decay"]
    sweep["wds"] = [float(v) for v in _as_list(config.get("weight_decays", default_wd))]
    sweep["optims"] = [optim_id(lr, wd, default_wd) for lr in sweep["lrs"] for wd in sweep["wds"]]
    if isinstance(config["methods"], list) and config["methods"] and all(
        isinstance(m, str) for m in config["methods"]
    ):
        sweep["methods"] = list(config["methods"])
    return sweep


# ----------------------------------------------------------------------------------------------
# what each job reads
# ----------------------------------------------------------------------------------------------

def train_config(config: dict, stage: str, *, seed: int, tokens: int | None = None,
                 lr: float | None = None, weight_decay: float | None = None) -> TrainConfig:
    """The TrainConfig of a job of `stage` ('small', 'large' or 'refine'): `train.<stage>` over the
    shared keys of `train` (refine: large's settings with refine's batch size and warm-up on top).
    `tokens` is the budget of a large job (the `budget` wildcard), else the stage's configured tokens;
    `lr` the peak learning rate of a large job (the `lr` wildcard), else the stage's configured one, and
    `weight_decay` its weight decay where the `lr` wildcard names one (`optim_id`).

    Every `train` key that names a field of TrainConfig sets it, cast to the field's type, so a new
    training setting is a field of TrainConfig and a key of the schema (with config.yaml, config/README
    and the rerun table), nothing here. The keys that say how the steps run (TrainConfig.HOW_FIELDS:
    compile, sync_every) are the machine's, set by the job; `dense_log_steps` is the refinement's
    only. Every value comes from the validated config (config.yaml under the overlays, the schema's
    defaults filled in): nothing here restates a default."""
    t = config["train"]
    first, *overrides = STAGE_SECTIONS[stage]
    values = {k: v for k, v in t.items() if k not in ("small", "large", "refine")}
    values.update(t[first])
    for section in overrides:
        values.update(t.get(section) or {})
    if tokens is not None:
        values["tokens"] = tokens
    if lr is not None:
        values["lr"] = lr
    if weight_decay is not None:
        values["weight_decay"] = weight_decay
    values.update(context=config["model"]["context"], seed=seed)
    if stage != "refine":
        values["dense_log_steps"] = 0
    cast = {"int": int, "float": float}
    return TrainConfig(**{f.name: cast.get(f.type, lambda v: v)(values[f.name]) for f in fields(TrainConfig)
                          if f.name in values and f.name not in TrainConfig.HOW_FIELDS})


def train_settings(config: dict, stage: str, *, seed: int, tokens: int | None = None,
                   lr: float | None = None, weight_decay: float | None = None) -> dict:
    """`train_config(...)` as the plain dict a rule declares as `params.train` (the settings that
    make the run what it is; how it runs is decided on the machine)."""
    return train_config(config, stage, seed=seed, tokens=tokens, lr=lr, weight_decay=weight_decay).run_settings()


def baseline_extend(config: dict) -> float:
    """`baseline.extend`: how many times its budget M_0's run trains (1: exactly the budget)."""
    return float(config["baseline"]["extend"])


def baseline_tokens(config: dict, budget: int) -> int:
    """The tokens M_0's run trains at `budget`: the budget, or `baseline.extend` times it, so that its cooldown
    branches end past the budget too (growlm.branches); the budget itself where it is not extended, so that
    such a run's settings, and so its results, stay what they were."""
    extend = baseline_extend(config)
    return int(budget) if extend == 1 else int(round(extend * int(budget)))


def large_settings(config: dict, *, seed: int, tokens: int, optim: str) -> dict:
    """M_0's training settings at a budget (`tokens`, trained `baseline.extend` times over: `baseline_tokens`)
    and optimizer id (the `lr` wildcard: `optim_id`)."""
    lr, wd = parse_optim(optim)
    return train_settings(config, "large", seed=seed, tokens=baseline_tokens(config, tokens), lr=lr, weight_decay=wd)


def refine_settings(config: dict, method: str, *, seed: int, tokens: int, lr) -> dict:
    """The refinement's training settings for `method`: the large arms' (`train_settings(..., "refine")`)
    with the method's own recipe on top, where its authors prescribe one (growlm.recipes). `lr`: a rate, or
    an optimizer id (`optim_id`) that may name a weight decay too."""
    rate, wd = parse_optim(lr)
    settings = train_settings(config, "refine", seed=seed, tokens=tokens, lr=rate, weight_decay=wd)
    return canonical(refine_recipe(config, method, settings))


def branch_points(config: dict, stage: str) -> dict:
    """{point id: fraction} of the cooldown branches of a large job of `stage` where it trains under wsd, else
    none (growlm.envelope, growlm.branches). 'large' (M_0): `train.branches`, fractions of the stable phase of
    M_0's run *of the budget*; where `baseline.extend` E > 1 trains M_0 past it, also 1 (the run of exactly the
    budget) and (1 + E) / 2, so that M_0's finished runs end below, at and beyond the budget. 'refine' (every
    M_1): `train.refine.branches`, fractions of the refinement's own stable phase."""
    if train_config(config, stage, seed=0).schedule != "wsd":
        return {}
    if stage == "refine":
        points = set(config["train"]["refine"]["branches"])
    else:
        points, extend = set(config["train"]["branches"]), baseline_extend(config)
        if extend > 1:
            points |= {1.0, (1.0 + extend) / 2}
    return {point_id(f): float(f) for f in sorted(float(p) for p in points)}


def model_settings(config: dict, *, n_embd: int, n_layer: int) -> dict:
    """Keyword arguments of `growlm.model.build_model` for a model of this experiment (the vocabulary
    size comes from the tokenizer when the job runs). A GPT-2 experiment's are what they were before
    the Llama family (no family key), so that its jobs' params, and so its results, stay as they are."""
    m = config["model"]
    out = dict(n_embd=int(n_embd), n_layer=int(n_layer), n_positions=m["context"], head_dim=m["head_dim"],
               tie_word_embeddings=m["tie_embeddings"])
    family = m["family"]
    if family != DEFAULT_FAMILY:  # the default family's settings stay what they were before there were families
        out["family"] = family
        for key, default in family_spec(family).settings.items():
            out[key] = m.get(key) if m.get(key) is not None else default
    if config["members"].get("pretrained"):  # built like the members: their config, resized
        out["like"] = pretrained_dir(config, 1)
    return out


def pretrained_dir(config: dict, member: int) -> str:
    """Where the import job puts pretrained member i (members.pretrained)."""
    return f"{results_dir(config['experiment'])}/models/pretrained/m{int(member)}"


def member_seed(seed: int, member: int) -> int:
    """Member i of experiment seed s is initialised, and its batches drawn, with seed 1000 s + i."""
    return 1000 * int(seed) + int(member)


def trunk_tokens(config: dict) -> int:
    """Tokens of the members' shared trunk (`members.trunk` of the members' budget; 0: none)."""
    return int(round(float(config["members"]["trunk"]) * int(config["train"]["small"]["tokens"])))


def member_train(config: dict, *, seed: int, member: int | None) -> dict:
    """The training settings of member i (data seed 1000 s + i) - with a shared trunk, of its branch
    (the members' budget less the trunk's) - or, for member=None, of the trunk itself (all of the
    members' text, seed 1000 s)."""
    trunk = trunk_tokens(config)
    if member is None:
        return train_settings(config, "small", seed=member_seed(seed, 0), tokens=trunk)
    tokens = int(config["train"]["small"]["tokens"]) - trunk
    return train_settings(config, "small", seed=member_seed(seed, member), tokens=tokens if trunk else None)


def members_keep_before_decay(config: dict) -> bool:
    """Whether the members train under wsd, and so each keeps its model where the decay begins (a
    declared output of its job, `BEFORE_DECAY` in its folder)."""
    return train_config(config, "small", seed=0).schedule == "wsd"


def member_source(config: dict, member_dir: str) -> str:
    """The folder of a member that the growth operators read (`members.source`): the member itself
    (annealed), or its model where its wsd decay began."""
    return f"{member_dir}/{BEFORE_DECAY}" if config["members"]["source"] == "before_decay" else member_dir


def member_shard(config: dict, member: int) -> list[int] | dict | None:
    """The part of the members' text member i trains on: [index, count] of a contiguous shard
    (`members.data: shards`), {"index", "count", "by": "book"} of a cluster of whole books
    (`members.data: clusters`, `growlm.tokens.book_clusters`), or None (`seed`: all of it)."""
    members = config["members"]
    index, count = (int(member) - 1) % members["shards"], members["shards"]
    if members["data"] == "clusters":
        return {"by": "book", "count": count, "index": index}
    if members["data"] != "shards":
        return None
    return [index, count]


def refine_steps(config: dict, budgets: list[int]) -> int:
    """Optimizer steps of the shortest refinement of the sweep."""
    refine = config["train"].get("refine") or {}
    batch = refine.get("batch_size", config["train"]["large"]["batch_size"])
    return min(int(b) for b in budgets) // (batch * config["model"]["context"])


def growth_options(config: dict, chain: list[str]) -> dict:
    """The configured `grow.options` of every operator in a chain, merged."""
    opts = {}
    for name in chain:
        opts.update(config["grow"]["options"].get(name, {}))
    return opts


def grow_settings(config: dict, method: str) -> dict:
    """What a grow job of `method` (a chain id, maybe with the control suffix) reads: the operators'
    configured options, with the authors' recipes where nothing is configured (growlm.recipes: the
    learned operators' steps, a share of the shortest refinement of the sweep), and, for learned
    operators, how to draw their level-1 batches. One grown model serves every budget of the sweep
    (the mask ramps are the refinement's, `refine_ramps`)."""
    chain = growth_names(method)
    options = growth_options(config, chain)
    check_options(chain, options)
    refine = refine_steps(config, normalise_sweep(config)["budgets"])
    out = {"options": grow_recipe(config, chain, options, refine_steps=refine)}  # the authors' recipes
    if any(OPERATORS[name].learned for name in chain):
        out["learned_batches"] = {"batch_size": config["train"]["large"]["batch_size"],
                                  "context": config["model"]["context"]}
    return canonical(out)


def plugin_files(config: dict, method) -> list[str]:
    """The files of `grow.plugins` whose operators `method` (a name, a chain or a chain id) uses: the
    inputs and params of its grow job; a method that uses none is left out of the plugin check
    before any job (`growlm.validate.plugin_checks`)."""
    used = {OPERATORS[nm].source for nm in method_chain(method) if nm in OPERATORS}
    return [p for p in config["grow"]["plugins"] if str(Path(p).resolve()) in used]


def refine_ramps(config: dict, method: str, *, budgets: list[int], budget: int | None = None) -> dict:
    """The mask-ramp lengths (refinement steps) of a grown model with growth masks (msg, concat):
    as configured in `grow.options` (a value below 1: that share of this refinement's steps, at `budget`,
    so that one setting serves every budget), else a fifth of the shortest refinement of the sweep, so
    that every refinement of the sweep starts the same way and ends as a plain GPT-2. Empty for methods
    without ramps."""
    chain = growth_names(method)
    configured = growth_options(config, chain)
    steps = refine_steps(config, budgets)
    own = refine_steps(config, [budget]) if budget is not None else steps
    return canonical({key: step_count(configured[key], own) if key in configured else share_of(steps)
                      for name in chain if name in OPERATORS for key in OPERATORS[name].ramps})


def refine_operators(config: dict, method: str, *, budgets: list[int], budget: int | None = None) -> dict:
    """{operator: options} of the refinement operators of `method` (teach, freeze, carry, a plugin's;
    growlm.refiners): the configured `grow.options`, else the defaults, with their step counts
    (teach_steps, freeze_steps) a share of the shortest refinement of the sweep unless configured
    (`growlm.methods.REFINE_SHARE`, a fifth); a configured step count below 1 is that share of this
    refinement's own steps (at `budget`): `teach_steps: 0.1` fades the members' teaching out over the
    first tenth of every refinement, whatever its budget."""
    steps = refine_steps(config, budgets)
    own = refine_steps(config, [budget]) if budget is not None else steps
    out = {}
    for name in refine_names(method):
        configured = config["grow"]["options"].get(name, {})
        opts = {**OPERATORS[name].options, **configured}
        for key in OPERATORS[name].ramps:
            opts[key] = step_count(configured[key], own) if key in configured else share_of(steps)
        out[name] = opts
    return canonical(out)


def step_count(value, steps: int) -> int:
    """A configured ramp or refiner step count: a whole number of steps, or - below 1 - that share of
    `steps` (at least one step)."""
    value = float(value)
    return max(1, int(value * steps)) if value < 1 else int(value)


def share_of(steps: int) -> int:
    """A ramp's or a refiner's step count by default: `REFINE_SHARE` of `steps` (at least 1)."""
    return max(1, int(steps * REFINE_SHARE))


def canonical(value):
    """A params value with its mappings' keys sorted, so that Snakemake's rerun trigger (which
    compares the values' text) sees meaning, not spelling: `{level: 1, name: a}` and
    `{name: a, level: 1}` are the same setting."""
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def schedule_settings(config: dict, method: str, *, n_embd: int, n_layer: int, seed: int) -> dict:
    """What the grow job of a schedule reads: its description's `settings` (growlm.methods), given what
    every schedule shares - the model, the reference budget (the shortest of the sweep), the large arms'
    first rate, and their training settings at that budget for a seed."""
    sweep = normalise_sweep(config)
    reference, lr = min(int(b) for b in sweep["budgets"]), float(sweep["lrs"][0])

    def train(seed_: int) -> dict:
        return train_config(config, "large", seed=int(seed_), tokens=reference, lr=lr).run_settings()

    return canonical(OPERATORS[method].settings(config, model=model_settings(config, n_embd=n_embd, n_layer=n_layer),
                                                seed=int(seed), reference=reference, lr=lr, train=train))


# ----------------------------------------------------------------------------------------------
# the corpus: reading levels and sources
# ----------------------------------------------------------------------------------------------

def level_names(config: dict) -> list[str]:
    """Every reading level of `corpus.sources`, as names: whole numbers first, in order, then the
    named levels in the order they first appear."""
    seen = list(dict.fromkeys(str(s["level"]) for s in config["corpus"]["sources"]))
    return sorted((v for v in seen if v.isdigit()), key=int) + [v for v in seen if not v.isdigit()]


def arm_levels(config: dict) -> dict:
    """{"members": [...], "large": [...], "evaluate": name}: the levels each arm trains on and the one
    whose test split the comparison reports (default: the first of the large arms')."""
    levels = config["levels"]
    members = [str(v) for v in _as_list(levels["members"])]
    large = [str(v) for v in _as_list(levels["large"])]
    evaluate = levels.get("evaluate")
    return {"members": members, "large": large, "evaluate": str(evaluate) if evaluate is not None else large[0]}


def level_dir(levels) -> str:
    """The folder name of a level or a mix of levels: 'level0', 'level0+tinystories'."""
    return "level" + "+".join(str(v) for v in _as_list(levels))


def source_settings(config: dict, source: dict) -> dict:
    """What the job preparing `source` reads: the source itself and the corpus settings it uses."""
    keys = ("val_fraction", "test_fraction", "min_words", "max_words")
    return canonical({"source": dict(source), "corpus": {k: config["corpus"][k] for k in keys}})


def split_caps(config: dict, level: str, split: str) -> dict:
    """{source: tokens} for the sources of `level` that set `max_tokens`, for one split: the cap is
    shared among the splits in proportion to their fractions."""
    c = config["corpus"]
    share = {"val": c["val_fraction"], "test": c["test_fraction"]}.get(split, 1 - c["val_fraction"] - c["test_fraction"])
    return {s["name"]: max(1, int(round(s["max_tokens"] * share))) for s in c["sources"]
            if str(s["level"]) == str(level) and s.get("max_tokens")}
