# Where everything goes: what each wildcard may match, the path templates of the token files and
# of every model, the combinations of the sweep, and the lists of targets built from them (what
# `rule all`, the comparison and the report ask for). No rules here.

import itertools
import os
import re
import sys
from pathlib import Path

from growlm.experiment import branch_points, level_dir, members_keep_before_decay
from growlm.train_config import BEFORE_DECAY

MEMBER_TOKENS = f"{R}/tokens/{level_dir(ARM_LEVELS['members'])}"  # + /train.npy, /val.npy
LARGE_TOKENS = f"{R}/tokens/{level_dir(ARM_LEVELS['large'])}"


wildcard_constraints:
    d0=r"\d+",
    d1=r"\d+",
    L0=r"\d+",
    L1=r"\d+",
    n=r"\d+",
    seed=r"\d+",
    budget=r"\d+",
    lr=r"[0-9.e+-]+(_wd[0-9.e+-]+)?",  # the peak rate, and the weight decay where it is not train.weight_decay
    member=r"\d+",
    level=r"[A-Za-z0-9_]+",
    levels=r"[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)+",
    split="train|val|test",
    source="|".join(re.escape(s) for s in SOURCES),
    method="|".join(re.escape(m) for m in METHOD_IDS),
    kind="small|baseline|refine",
    tool="nsys|ncu",
    point=r"[0-9.]+",


def combos():
    """Every (d0, L0, d1, L1, n, method, seed, budget, lr) of the sweep, as dicts of wildcard values, in an
    order that does not depend on the order of `methods` in the config (methods by name): the params
    built from it (the comparison's, the profiled combination) are the same whatever that order."""
    keys = ["d0", "L0", "d1", "L1", "n", "method", "seed", "budget", "lr"]
    values = [
        SWEEP["d0"],
        SWEEP["L0"],
        SWEEP["d1"],
        SWEEP["L1"],
        SWEEP["n"],
        sorted(METHOD_IDS),
        SWEEP["seeds"],
        SWEEP["budgets"],
        SWEEP["optims"],  # the `lr` wildcard: each rate with each weight decay (growlm.experiment.optim_id)
    ]
    return [dict(zip(keys, v)) for v in itertools.product(*values)]


SMALL = res("models/small/d{d0}_L{L0}/s{seed}/m{member}")
PRETRAINED = res("models/pretrained/m{member}")  # members.pretrained: imported, not trained
MEMBER_PART = res("models/pretrained/m1_{part}.json")  # what the tokenizer and M_0 take from member 1 (inputs.smk)
TRUNK = res("models/trunk/d{d0}_L{L0}/s{seed}")  # the members' shared trunk (members.trunk > 0)
BASELINE = res("models/baseline/d{d1}_L{L1}/t{budget}_lr{lr}/s{seed}")
GROWN = res("models/grown/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/s{seed}")
REFINED = res("models/refined/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/t{budget}_lr{lr}/s{seed}")
ENSEMBLE = res("eval/ensemble/d{d0}_L{L0}/n{n}/s{seed}/metrics.json")
SOURCE_FILES = [f"{split}.{ext}" for split in SPLITS for ext in ("txt", "keys", "counts")] + ["source.json"]


def ensemble_targets():
    if not config["controls"]["ensemble"]:
        return []
    return sorted({ENSEMBLE.format(**c) for c in combos()})


def before_decay_output():
    """A wsd member's model where its decay began (members.source), in its folder: a declared output of
    its job whenever the members train under wsd, so that choosing members.source retrains nothing."""
    return {"before_decay": f"{SMALL}/{BEFORE_DECAY}/model.safetensors"} if members_keep_before_decay(config) else {}


# --- cooldown branches (train.branches, under wsd): growlm.envelope ---------------------------------
BRANCHES = {"baseline": branch_points(config, "large"), "refine": branch_points(config, "refine")}


def branch_outputs(model):
    """The states a large training job keeps for its cooldown branches (`model`: BASELINE or REFINED), as
    its declared outputs: temporary, so each goes once its branch's job has read it."""
    kind = "baseline" if model == BASELINE else "refine"
    return {f"branch_{p}": temp(directory(f"{model}/branches/b{p}/state")) for p in BRANCHES[kind]}


def branch_targets(dirs=None):
    """The branch records of every large model of the sweep (`dirs`: the models' folders)."""
    out = []
    for d in dirs if dirs is not None else model_dirs():
        kind = {"baseline": "baseline", "refined": "refine"}.get(Path(d).relative_to(R).parts[1])
        out += [f"{d}/branches/b{p}/branch.json" for p in BRANCHES.get(kind) or {}]
    return out


def before_decay_models():
    """Every trained member's model where its wsd decay began (`before_decay_output`), asked for by `all` and the
    comparison whatever members.source says. Snakemake compares a job's params only when every output it declares
    has a record, and reruns a job for a missing output only when a job that must run asks for it: a member whose
    job gains this output (its schedule changed to wsd) would otherwise keep its cosine model without a word."""
    if PRETRAINED_MEMBERS or not members_keep_before_decay(config):
        return []
    dirs = {SMALL.format(member=m, **c) for c in combos() for m in range(1, int(c["n"]) + 1)}
    return sorted(f"{d}/{BEFORE_DECAY}/model.safetensors" for d in dirs)


def small_dir(c, member):
    """Member `member`'s folder for combination (or wildcards) `c`: trained, or imported (pretrained)."""
    if PRETRAINED_MEMBERS:
        return PRETRAINED.format(member=member)
    return SMALL.format(member=member, **c)


def model_dirs():
    """Every model folder of the sweep (members, baselines, refined)."""
    dirs = set()
    for c in combos():
        for member in range(1, int(c["n"]) + 1):
            dirs.add(small_dir(c, member))
        dirs.add(BASELINE.format(**c))
        dirs.add(REFINED.format(**c))
    return sorted(dirs)


def trained_dirs():
    """The model folders growlm trained (each has a ledger): all but imported members."""
    return [d for d in model_dirs() if "/models/pretrained/" not in d]


def grown_dirs():
    return sorted({GROWN.format(**c) for c in combos()})


def eval_targets():
    return [f"{d}/metrics.json".replace(res("models/"), res("eval/"), 1) for d in model_dirs()]


# --- lm-evaluation-harness tasks (evaluate.tasks): one job per model and task entry -------------


def task_targets():
    """The task records of every model of the sweep (none when evaluate.tasks is empty)."""
    return [f"{d}/tasks/{task}.json".replace(res("models/"), res("eval/"), 1) for d in model_dirs() for task in TASKS]


def extra_targets():
    """Targets of `all` that only some experiments have: the task scores and their report (with
    evaluate.tasks), the cost ratio against the budget (with several budgets)."""
    out = []
    if TASKS:
        out += [res("eval/tasks.csv"), res("report/tasks.html"), res("report/tasks.svg")]
    if len(SWEEP["budgets"]) > 1:
        out.append(res("report/cost_vs_budget.svg"))
    return out


# --- profiling: one small member, M_0 and M'_1 of the first sweep values -------------------------
PROFILE_KINDS = ["small", "baseline", "refine"]


def profile_targets():
    tools = [t for t in config["profile"]["tools"] if t in ("nsys", "ncu")]
    kinds = [k for k in PROFILE_KINDS if not (k == "small" and PRETRAINED_MEMBERS)]  # no member is trained
    return [f"{R}/profile/{tool}/{kind}/summary.csv" for tool in tools for kind in kinds]


def _first_combo():
    return combos()[0]


# --- what a finished run leaves: the experiment's folder as later runs and the report need it ----


def kept_outputs():
    """The experiment's products that later runs and the report rely on: every trained model's weights
    and ledger, every grown model, the token files. `rule all` asks for them too, so one that vanished
    after a finished run is made again (with everything that depends on it), never reported on."""
    files = [f"{d}/model.safetensors" for d in model_dirs()]
    files += [f"{d}/ledger.csv" for d in trained_dirs()]
    files += [f"{d}/growth.json" for d in grown_dirs()]
    files += before_decay_models()  # a wsd member's model where its decay began
    files += [f"{tokens}/{split}.npy" for tokens in (MEMBER_TOKENS, LARGE_TOKENS) for split in ("train", "val")]
    files += [res(f"tokens/level{level}/test.npy") for level in LEVELS]
    return sorted(set(files))


# --- what needs the network (rule prepare, rules/prepare.smk) ----------------------------------


def prepare_targets():
    """The outputs whose jobs read the network: Hub sources, Hub members, task data."""
    out = [
        res(f"corpus/sources/{source['name']}/source.json")
        for source in config["corpus"]["sources"]
        if source.get("hf") and not Path(str(source["hf"])).is_dir()
    ]
    out += [
        f"{PRETRAINED.format(member=i + 1)}/model.safetensors"
        for i, item in enumerate(PRETRAINED_MEMBERS)
        if pretrained_spec(item)["kind"] == "hf"
    ]
    out += [res(f"tasks/data/{tid}.json") for tid, spec in TASKS.items() if not spec.get("bundled")]
    return out


def say_prepared(count, log_file):
    """What rule prepare says when it is done, in its log and on the terminal."""
    said = (
        f"growlm: prepared {count} input(s) that need the network; run the rest anywhere that shares results/ "
        f"and the Hub's cache ({os.environ.get('HF_HOME', '~/.cache/huggingface')}), with HF_HUB_OFFLINE=1 where "
        "there is no network"
    )
    Path(log_file).write_text(f"{said}\n")
    print(said, file=sys.stderr)
