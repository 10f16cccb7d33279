# Config validation, sweep normalisation, wildcard constraints, target lists, and what each job
# reads: its params come from growlm.experiment, resolved from the config sections it depends on.
# No rules here.

import itertools
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# this workflow's own copy of the library (also when it is used as a module, e.g. after snakedeploy)
sys.path.insert(0, str(Path(str(workflow.current_basedir)).parent / "scripts"))

from growlm.experiment import (  # noqa: E402
    check_experiment,
    coerce_command_line,
    grow_settings,
    member_seed,
    member_shard,
    model_settings,
    normalise_sweep,
    schedule_settings,
    train_settings,
)
from growlm.methods import (  # noqa: E402
    SCHEDULES,
    SINGLE_MEMBER,
    is_single_member_control,
    method_id,
    needs_single_member_control,
)

coerce_command_line(config)
validate(config, schema="../schemas/config.schema.yaml")
SWEEP = normalise_sweep(config)
try:
    check_experiment(config, SWEEP)
except ValueError as err:
    raise WorkflowError(f"config error: {err}")

LEVELS = sorted({int(s["level"]) for s in config["corpus"]["sources"]})
SPLITS = ["train", "val", "test"]
SOURCES = {s["name"]: s for s in config["corpus"]["sources"]}
# the books shipped with the workflow, found beside this file wherever the workflow lives
BUNDLED = {
    name: workflow.source_path(f"../resources/corpus/{s['bundled']}") for name, s in SOURCES.items() if s.get("bundled")
}
METHOD_IDS = [method_id(m) for m in SWEEP["methods"]]
if config["controls"]["single_member"]:
    # single-source chains and the schedules already use m_1 alone (or no member): no duplicate arm
    METHOD_IDS += [m + SINGLE_MEMBER for m in METHOD_IDS if needs_single_member_control(m)]


wildcard_constraints:
    d0=r"\d+",
    d1=r"\d+",
    L0=r"\d+",
    L1=r"\d+",
    n=r"\d+",
    seed=r"\d+",
    budget=r"\d+",
    lr=r"[0-9.e+-]+",
    member=r"\d+",
    level=r"\d+",
    split="train|val|test",
    source="|".join(SOURCES),
    method="|".join(re.escape(m) for m in METHOD_IDS),
    kind="small|baseline|refine",
    tool="nsys|ncu",


def combos():
    """Every (d0, L0, d1, L1, n, method, seed, budget, lr) of the sweep, as dicts of wildcard values."""
    keys = ["d0", "L0", "d1", "L1", "n", "method", "seed", "budget", "lr"]
    values = [
        SWEEP["d0"],
        SWEEP["L0"],
        SWEEP["d1"],
        SWEEP["L1"],
        SWEEP["n"],
        METHOD_IDS,
        SWEEP["seeds"],
        SWEEP["budgets"],
        SWEEP["lrs"],
    ]
    return [dict(zip(keys, v)) for v in itertools.product(*values)]


SMALL = "results/models/small/d{d0}_L{L0}/s{seed}/m{member}"
BASELINE = "results/models/baseline/d{d1}_L{L1}/t{budget}_lr{lr}/s{seed}"
GROWN = "results/models/grown/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/s{seed}"
REFINED = "results/models/refined/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/t{budget}_lr{lr}/s{seed}"
ENSEMBLE = "results/eval/ensemble/d{d0}_L{L0}/n{n}/s{seed}/metrics.json"


def ensemble_targets():
    if not config["controls"]["ensemble"]:
        return []
    return sorted({ENSEMBLE.format(**c) for c in combos()})


def model_dirs():
    """Every trained model folder of the sweep (members, baselines, refined)."""
    dirs = set()
    for c in combos():
        for member in range(1, int(c["n"]) + 1):
            dirs.add(SMALL.format(member=member, **c))
        dirs.add(BASELINE.format(**c))
        dirs.add(REFINED.format(**c))
    return sorted(dirs)


def grown_dirs():
    return sorted({GROWN.format(**c) for c in combos()})


def eval_targets():
    return [f"{d}/metrics.json".replace("results/models/", "results/eval/", 1) for d in model_dirs()]


def member_dirs(wildcards):
    """The n small members a grow job combines (m_1 n times for the single-member control)."""
    single = is_single_member_control(getattr(wildcards, "method", ""))
    return [
        SMALL.format(d0=wildcards.d0, L0=wildcards.L0, seed=wildcards.seed, member=1 if single else i)
        for i in range(1, int(wildcards.n) + 1)
    ]


def member_models(wildcards):
    if wildcards.method in SCHEDULES:  # the schedules reuse no small model
        return []
    return [f"{d}/model.safetensors" for d in member_dirs(wildcards)]


def source_input(wildcards):
    src = SOURCES[wildcards.source]
    if src.get("bundled"):
        return BUNDLED[wildcards.source]
    if src.get("path"):
        return src["path"]
    return f"resources/downloads/{wildcards.source}.txt"


def level_sources(wildcards):
    names = [s["name"] for s in config["corpus"]["sources"] if int(s["level"]) == int(wildcards.level)]
    return [f"results/corpus/sources/{name}.txt" for name in names]


# --- what each job reads: its params ------------------------------------------------------------


def corpus_settings():
    return {k: v for k, v in config["corpus"].items() if k != "sources"}


def small_train(wildcards):
    return train_settings(config, "small", seed=member_seed(wildcards.seed, wildcards.member))


def baseline_train(wildcards):
    return train_settings(
        config, "large", seed=int(wildcards.seed), tokens=int(wildcards.budget), lr=float(wildcards.lr)
    )


def refine_train(wildcards):
    return train_settings(
        config, "refine", seed=int(wildcards.seed), tokens=int(wildcards.budget), lr=float(wildcards.lr)
    )


def grow_params(wildcards):
    if wildcards.method in SCHEDULES:
        return schedule_settings(
            config, wildcards.method, n_embd=int(wildcards.d1), n_layer=int(wildcards.L1), seed=int(wildcards.seed)
        )
    return {"members": member_dirs(wildcards), **grow_settings(config, wildcards.method, budgets=SWEEP["budgets"])}


def training_resources():
    """The resources every training rule asks for (scaled by the attempt on retries)."""
    res = config["resources"]
    return dict(
        gpu=res["gpu"],
        cpus_per_gpu=res["cpus_per_gpu"],
        mem_mb=lambda wc, attempt: res["mem_mb"] * attempt,
        runtime=lambda wc, attempt: res["runtime"] * attempt,
    )


# --- profiling: one small member, M_0 and M'_1 of the first sweep values -------------------------
PROFILE_KINDS = ["small", "baseline", "refine"]


def profile_targets():
    tools = [t for t in config["profile"]["tools"] if t in ("nsys", "ncu")]
    return [f"results/profile/{tool}/{kind}/summary.csv" for tool in tools for kind in PROFILE_KINDS]


def _first_combo():
    return combos()[0]


def profile_inputs(wildcards):
    c = _first_combo()
    level = 0 if wildcards.kind == "small" else 1
    inputs = {"tokens": f"results/tokens/level{level}/train.npy", "tokenizer": "results/tokenizer/tokenizer.json"}
    if wildcards.kind == "refine":
        inputs["grown"] = f"{GROWN.format(**c)}/growth.json"
    return inputs


def profile_params(wildcards):
    """The model and training settings of the profiled kind (the first combination of the sweep)."""
    c = _first_combo()
    small = wildcards.kind == "small"
    stage = {"small": "small", "baseline": "large", "refine": "refine"}[wildcards.kind]
    model = model_settings(config, n_embd=c["d0"] if small else c["d1"], n_layer=c["L0"] if small else c["L1"])
    return {
        "train": train_settings(config, stage, seed=0),
        "model": model,
        "grown": GROWN.format(**c) if wildcards.kind == "refine" else None,
        "settings": {k: v for k, v in config["profile"].items() if k != "tools"},  # the tool is the wildcard
    }
