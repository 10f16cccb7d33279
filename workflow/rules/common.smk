# Config validation, sweep normalisation, wildcard constraints, target lists and input functions.
# No rules here.

import itertools
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "workflow" / "scripts"))

from growlm.experiment import (  # noqa: E402
    SCHEDULES,
    SINGLE_MEMBER,
    check_experiment,
    coerce_command_line,
    method_chain,
    is_single_member_control,
    method_id,
    needs_single_member_control,
    normalise_sweep,
    train_settings,
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


def combos():
    """Every (d0, L0, d1, L1, n, method, seed, budget, lr) of the sweep, as dicts of wildcard values."""
    keys = ["d0", "L0", "d1", "L1", "n", "method", "seed", "budget", "lr"]
    values = [SWEEP["d0"], SWEEP["L0"], SWEEP["d1"], SWEEP["L1"], SWEEP["n"], METHOD_IDS, SWEEP["seeds"],
              SWEEP["budgets"], SWEEP["lrs"]]
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


def member_dirs(wildcards):
    """The n small members a grow job combines (m_1 n times for the single-member control)."""
    single = is_single_member_control(getattr(wildcards, "method", ""))
    return [
        SMALL.format(d0=wildcards.d0, L0=wildcards.L0, seed=wildcards.seed, member=1 if single else i)
        for i in range(1, int(wildcards.n) + 1)
    ]


def member_models(wildcards):
    if wildcards.method in SCHEDULES:  # the V-cycle reuses no small model
        return []
    return [f"{d}/model.safetensors" for d in member_dirs(wildcards)]


def level_text(level, split):
    return f"results/corpus/level{level}/{split}.txt"


def source_input(wildcards):
    src = SOURCES[wildcards.source]
    if src.get("path"):
        return src["path"]
    return f"resources/downloads/{wildcards.source}.txt"


def level_sources(wildcards):
    names = [s["name"] for s in config["corpus"]["sources"] if int(s["level"]) == int(wildcards.level)]
    return [f"results/corpus/sources/{name}.txt" for name in names]


def train_resources(attempt):
    res = config["resources"]
    return {"mem_mb": res["mem_mb"] * attempt, "runtime": res["runtime"] * attempt}


def eval_targets():
    return [f"{d}/metrics.json".replace("results/models/", "results/eval/", 1) for d in model_dirs()]


# --- profiling: one small member, M_0 and M'_1 of the first sweep values -----------------------
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


def profile_args(wildcards):
    c = _first_combo()
    small = wildcards.kind == "small"
    return {
        "kind": wildcards.kind,
        "width": int(c["d0"] if small else c["d1"]),
        "depth": int(c["L0"] if small else c["L1"]),
        "grown": GROWN.format(**c) if wildcards.kind == "refine" else None,
    }


def configured_growth_options(wildcards):
    """grow.options of every operator in the method's chain, merged."""
    opts = {}
    for name in method_chain(wildcards.method):
        opts.update(config["grow"]["options"].get(name, {}))
    return opts


def shortest_refine_steps():
    refine = config["train"].get("refine") or {}
    batch = refine.get("batch_size", config["train"]["large"]["batch_size"])
    return min(SWEEP["budgets"]) // (batch * config["model"]["context"])
