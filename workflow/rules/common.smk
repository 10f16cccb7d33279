# Config validation, sweep normalisation, wildcard constraints, target lists, and what each job
# reads: its params come from growlm.experiment, resolved from the config sections it depends on.
# No rules here.

import itertools
import os
import re
import sys
from pathlib import Path

from snakemake.cli import get_argument_parser
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# this workflow's own copy of the library (also when it is used as a module, e.g. after snakedeploy)
RULES_DIR = str(workflow.current_basedir)  # this folder, also when growlm runs as another workflow's module
sys.path.insert(0, str(Path(RULES_DIR).parent / "scripts"))

from growlm import hints, outputs  # noqa: E402
from growlm.errors import GrowlmError  # noqa: E402
from growlm.experiment import (  # noqa: E402
    arm_levels,
    canonical,
    grow_settings,
    level_dir,
    level_names,
    member_seed,
    member_shard,
    member_train,
    model_settings,
    plugin_files,
    refine_operators,
    refine_ramps,
    refine_settings,
    schedule_settings,
    source_settings,
    split_caps,
    train_settings,
    trunk_tokens,
)
from growlm.methods import (  # noqa: E402
    SCHEDULES,
    SINGLE_MEMBER,
    is_single_member_control,
    method_id,
    needs_single_member_control,
)
from growlm.interrupted import interrupted_run_notice  # noqa: E402
from growlm.pretrained import spec_of as pretrained_spec  # noqa: E402
from growlm.sources import hub_problem, local_files  # noqa: E402
from growlm.tasks import task_problems, task_specs  # noqa: E402
from growlm.validate import check_config, check_plugin_operators, experiment_warnings  # noqa: E402

# every command growlm prints for you to run is your own command line (growlm.hints): the jobs
# inherit it through the environment
COMMAND = hints.export_command(sys.argv, hints.option_table(get_argument_parser()))
MAIN_PROCESS = not hints.is_job_step(sys.argv)  # not one job's step (a SLURM job parses this file again)
DRY_RUN = "dryrun" in COMMAND["given"]


def shipped(rel):
    """A file shipped with the workflow, `rel` from this folder, found wherever the workflow lives.

    In a local checkout it is written relative to the working directory when the workflow lives
    inside it (the usual clone): Snakemake records every job's input paths, and an absolute path
    would make a moved or copied project rerun from its first job ("set of input files has
    changed"). A missing file keeps its path, for growlm.validate to name it. A workflow used as a
    module from a remote repository goes through Snakemake's source cache."""
    if not os.path.isdir(RULES_DIR):
        return workflow.source_path(rel)
    path = os.path.normpath(os.path.join(os.path.abspath(RULES_DIR), rel))
    inside = os.path.relpath(path, os.getcwd())
    return path if inside.startswith(os.pardir) else inside


def bundled_path(file):
    """A book of the bundled corpus (`bundled:` in a source)."""
    return shipped(f"../resources/corpus/{file}")


def source_file(source):
    """Where a configured source's data is on this machine, for growlm.validate to check: a bundled
    book, your own `path` (a file, folder or glob), or a Hub-layout folder named by `hf`; None for
    a download (checked by its sha256) or a Hub id (checked by the job that reads it)."""
    if source.get("bundled"):
        return Path(str(bundled_path(source["bundled"])))
    if source.get("path"):
        return source["path"]
    if source.get("hf") and Path(source["hf"]).is_dir():
        return source["hf"]
    return None


# every value, every combination of the sweep and every source, before any job (growlm.validate)
try:
    SWEEP = check_config(
        config,
        Path(str(workflow.current_basedir)).parent / "schemas" / "config.schema.yaml",
        resolve_source=source_file,
        fill_defaults=lambda c: validate(c, schema="../schemas/config.schema.yaml"),
    )
except GrowlmError as err:
    raise WorkflowError(f"config error: {err}")

# the experiment's folder: results/ for the default experiment, results/<experiment>/ for any other
EXPERIMENT = config["experiment"]
R = outputs.results_dir(EXPERIMENT)


def res(path):
    """A path inside this experiment's results folder."""
    return f"{R}/{path}"


# a run killed before this one left its lock: say how to continue (Snakemake checks the lock next)
NOTICE = interrupted_run_notice(Path.cwd(), sys.argv)
if NOTICE:
    print(NOTICE, file=sys.stderr)

LEVELS = level_names(config)
ARM_LEVELS = arm_levels(config)
MEMBER_TOKENS = f"{R}/tokens/{level_dir(ARM_LEVELS['members'])}"  # + /train.npy, /val.npy
LARGE_TOKENS = f"{R}/tokens/{level_dir(ARM_LEVELS['large'])}"
EVAL_LEVEL = ARM_LEVELS["evaluate"]
SPLITS = ["train", "val", "test"]
SOURCES = {s["name"]: s for s in config["corpus"]["sources"]}
METHOD_IDS = [method_id(m) for m in SWEEP["methods"]]
PLUGINS = config["grow"]["plugins"]  # your own operators (growlm.plugins), declared by check_config


onstart:
    # import the plugins for real and grow tiny random members with each of their operators, before
    # any job: a broken plugin stops here, naming the file (growlm.validate.check_plugin_operators)
    if PLUGINS:
        try:
            print(check_plugin_operators(config, SWEEP, res("plugins/check.json")), file=sys.stderr)
        except GrowlmError as err:
            raise WorkflowError(str(err))


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
    level=r"[A-Za-z0-9_]+",
    levels=r"[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)+",
    split="train|val|test",
    source="|".join(re.escape(s) for s in SOURCES),
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


SMALL = res("models/small/d{d0}_L{L0}/s{seed}/m{member}")
PRETRAINED = res("models/pretrained/m{member}")  # members.pretrained: imported, not trained
PRETRAINED_MEMBERS = config["members"].get("pretrained") or []
TRUNK = res("models/trunk/d{d0}_L{L0}/s{seed}")  # the members' shared trunk (members.trunk > 0)
BASELINE = res("models/baseline/d{d1}_L{L1}/t{budget}_lr{lr}/s{seed}")
GROWN = res("models/grown/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/s{seed}")
REFINED = res("models/refined/{method}/d{d0}_L{L0}_to_d{d1}_L{L1}/n{n}/t{budget}_lr{lr}/s{seed}")
ENSEMBLE = res("eval/ensemble/d{d0}_L{L0}/n{n}/s{seed}/metrics.json")


def ensemble_targets():
    if not config["controls"]["ensemble"]:
        return []
    return sorted({ENSEMBLE.format(**c) for c in combos()})


def pretrained_files(wildcards):
    """The local files a pretrained member is imported from (none for a Hub id)."""
    spec = pretrained_spec(PRETRAINED_MEMBERS[int(wildcards.member) - 1])
    if spec["kind"] != "path":
        return []
    return sorted(str(p) for p in Path(spec["where"]).iterdir() if p.is_file())


def like_config(wildcards):
    """M_0 is built like the pretrained members (their config, resized): it waits for member 1's import."""
    return [f"{PRETRAINED.format(member=1)}/config.json"] if PRETRAINED_MEMBERS else []


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


def member_dirs(wildcards):
    """The n small members a grow job combines (m_1 n times for the single-member control)."""
    single = is_single_member_control(getattr(wildcards, "method", ""))
    c = dict(d0=wildcards.d0, L0=wildcards.L0, seed=wildcards.seed)
    return [small_dir(c, 1 if single else i) for i in range(1, int(wildcards.n) + 1)]


def member_models(wildcards):
    if wildcards.method in SCHEDULES:  # the schedules reuse no small model
        return []
    return [f"{d}/model.safetensors" for d in member_dirs(wildcards)]


def source_input(wildcards):
    """The local files a source is prepared from (none for a Hub id: its revision is its identity)."""
    src = SOURCES[wildcards.source]
    if src.get("bundled"):
        return [bundled_path(src["bundled"])]
    if src.get("url"):
        return [f"{R}/downloads/{wildcards.source}.txt"]
    spec = src.get("path") or src["hf"]
    return [str(f) for f in local_files(spec)] if src.get("path") or Path(spec).is_dir() else []


SOURCE_FILES = [f"{split}.{ext}" for split in SPLITS for ext in ("txt", "keys", "counts")] + ["source.json"]


def level_source_names(wildcards):
    return [s["name"] for s in config["corpus"]["sources"] if str(s["level"]) == wildcards.level]


def level_sources(wildcards):
    return [f"{R}/corpus/sources/{name}/{f}" for name in level_source_names(wildcards) for f in SOURCE_FILES]


def prep_threads(wildcards=None):
    """Cores of a corpus job: corpus.threads, or all of --cores."""
    return config["corpus"]["threads"] or workflow.cores


def source_threads(wildcards):
    """A bundled book or a small file is one document: one core; anything else gets prep_threads."""
    files = source_input(wildcards)
    if files and sum(os.path.getsize(f) for f in files if os.path.isfile(f)) < 8 << 20:
        return 1
    return prep_threads()


# --- what each job reads: its params ------------------------------------------------------------


def small_train(wildcards):
    return member_train(config, seed=int(wildcards.seed), member=int(wildcards.member))


def trunk_train(wildcards):
    return member_train(config, seed=int(wildcards.seed), member=None)


def trunk_model(wildcards):
    """The members' shared trunk a member branches from (members.trunk > 0), else nothing."""
    if not trunk_tokens(config):
        return []
    return f"{TRUNK.format(d0=wildcards.d0, L0=wildcards.L0, seed=wildcards.seed)}/model.safetensors"


def branch_from(wildcards, input):
    """The trunk's folder (a params function of the input: the input itself is the rerun trigger)."""
    return str(Path(input.trunk).parent) if trunk_tokens(config) else None


def baseline_train(wildcards):
    return train_settings(
        config, "large", seed=int(wildcards.seed), tokens=int(wildcards.budget), lr=float(wildcards.lr)
    )


def refine_train(wildcards):
    return refine_settings(
        config, wildcards.method, seed=int(wildcards.seed), tokens=int(wildcards.budget), lr=float(wildcards.lr)
    )


def grow_params(wildcards):
    if wildcards.method in SCHEDULES:
        return schedule_settings(
            config, wildcards.method, n_embd=int(wildcards.d1), n_layer=int(wildcards.L1), seed=int(wildcards.seed)
        )
    plugins = plugin_files(config, wildcards.method)
    return {
        "members": member_dirs(wildcards),
        **grow_settings(config, wildcards.method),
        **({"plugins": plugins} if plugins else {}),
    }


def training_resources():
    """The resources every training rule asks for (scaled by the attempt on retries)."""
    res = config["resources"]
    return dict(
        gpu=res["gpu"],
        cpus_per_gpu=res["cpus_per_gpu"],
        mem_mb=lambda wc, attempt: res["mem_mb"] * attempt,
        runtime=lambda wc, attempt: res["runtime"] * attempt,
    )


def live_settings(wildcards, output):
    """Where a training job writes its live curves (`train.log_to`; None: nowhere): one run per model
    under the experiment's live/ folder, named by the model's path under models/. A params function of
    the output, so Snakemake leaves it out of the rerun trigger: changing train.log_to reruns nothing."""
    if not config["train"]["log_to"]:
        return None
    name = os.path.relpath(str(Path(output.model).parent), res("models"))
    return {"to": list(config["train"]["log_to"]), "dir": res(f"live/{name}"), "name": name, "experiment": EXPERIMENT}


def evaluation_resources():
    """An evaluation job runs its model on the GPU when there is one, so it counts as a GPU job: at
    most one GPU (evaluation runs in one process), none when the training jobs ask for none."""
    return dict(gpu=min(1, config["resources"]["gpu"]))


def job_how(wildcards, resources):
    """How a training job runs on what it was given, never what it computes: the GPUs it asked for
    (torchrun with several), the share of each GPU's memory its planner may budget
    (`resources.gpu_share`), `train.compile` and `train.sync_every`. The job passes them on as keyword
    arguments.

    This params function takes `resources`, so Snakemake counts it as derived from the job's
    resources and leaves it out of the params rerun trigger (Snakemake's rule for params that read
    input, output, threads or resources): changing how a job runs reruns nothing, as for
    `train.threads`. The checkpoint fingerprint leaves these out too (TrainConfig.HOW_FIELDS), so a
    run resumes under any of them."""
    return {
        "gpus": int(resources.gpu),
        "gpu_share": float(config["resources"]["gpu_share"]),
        "compile": config["train"]["compile"],
        "sync_every": int(config["train"]["sync_every"]),
    }


# --- lm-evaluation-harness tasks (evaluate.tasks): one job per model and task entry -------------
# growlm's own tasks (growlm.tasks.BUNDLED) are written into the experiment's tasks/ folder, data included
TASKS = {spec["id"]: spec for spec in task_specs(config["evaluate"]["tasks"], bundled_dir=res("tasks"))}


def task_targets():
    """The task records of every model of the sweep (none when evaluate.tasks is empty)."""
    return [f"{d}/tasks/{task}.json".replace(res("models/"), res("eval/"), 1) for d in model_dirs() for task in TASKS]


def task_inputs(wildcards):
    """What a task run reads besides the model: the written folder of a bundled task, every file of a
    local task folder (editing its YAML reruns it); a registry task reads the Hub."""
    spec = TASKS[wildcards.task]
    if spec["bundled"]:
        return [f"{spec['folder']}/{wildcards.task}.yaml", f"{spec['folder']}/test.jsonl"]
    if spec["folder"]:
        return sorted(str(f) for f in Path(spec["folder"]).rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    return []


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


def profile_inputs(wildcards):
    c = _first_combo()
    tokens = MEMBER_TOKENS if wildcards.kind == "small" else LARGE_TOKENS
    inputs = {"tokens": f"{tokens}/train.npy", "tokenizer": res("tokenizer/tokenizer.json")}
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
        "settings": canonical({k: v for k, v in config["profile"].items() if k != "tools"}),  # tool: the wildcard
    }


# --- before any job: is the experiment's folder whole, and what will this run do to it ----------


def kept_outputs():
    """The experiment's products that later runs and the report rely on: every trained model's weights
    and ledger, every grown model, the token files. `rule all` asks for them too, so one that vanished
    after a finished run is made again (with everything that depends on it), never reported on."""
    files = [f"{d}/model.safetensors" for d in model_dirs()]
    files += [f"{d}/ledger.csv" for d in trained_dirs()]
    files += [f"{d}/growth.json" for d in grown_dirs()]
    files += [f"{tokens}/{split}.npy" for tokens in (MEMBER_TOKENS, LARGE_TOKENS) for split in ("train", "val")]
    files += [res(f"tokens/level{level}/test.npy") for level in LEVELS]
    return sorted(set(files))


def preflight():
    """The checks of the user's run (a job's step skips them), before Snakemake plans any job:

    - a file a job recorded a sha256 for that no longer matches it, or a tokenizer or growth record
      that no longer parses, stops the run naming it and the one line that rebuilds it and continues
      (a job would notice only after Snakemake had deleted the outputs it was rerun for);
    - outputs of a finished run that are gone are said to be made again (they are targets of `all`);
      `--report` stops instead of describing models that no longer exist;
    - settings changed since the folder's last finished run, and legal but surprising values
      (growlm.validate.experiment_warnings), are printed as warnings."""
    forced = set(COMMAND["targets"]) if {"force", "forceall"} & set(COMMAND["given"]) else set()
    damaged = [(path, why) for path, why in outputs.damaged_files(R) if hints.rebuild_target(path) not in forced]
    if damaged:
        lines = [f"{path} is damaged ({why})" for path, why in damaged]
        raise WorkflowError(
            "; ".join(lines) + f"; rebuild {'it' if len(lines) == 1 else 'them'} and continue with "
            f"`{hints.rebuild(*[path for path, _ in damaged])}`"
        )
    if os.path.exists(res("eval/comparison.csv")):
        gone = outputs.missing(kept_outputs())
        if gone:
            listed = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
            if "report" in COMMAND["given"]:
                raise WorkflowError(
                    f"{len(gone)} output(s) of this experiment are gone ({listed}); the report would describe "
                    f"models that no longer exist. Make them again with `{hints.again()}`, then build the report"
                )
            print(
                f"growlm: {len(gone)} output(s) of this experiment's finished run are gone ({listed}); this run "
                "makes them again, and everything that depends on them",
                file=sys.stderr,
            )
    for i, source in enumerate(config["corpus"]["sources"]):
        # a Hub dataset not yet prepared: asked of the Hub now, not by a job that would retry
        if source.get("hf") and not Path(source["hf"]).is_dir():
            if not os.path.exists(res(f"corpus/sources/{source['name']}/source.json")):
                problem = hub_problem(source)
                if problem and not DRY_RUN:
                    raise WorkflowError(f"config error: corpus.sources[{i}] ({source['name']}): {problem}")
                if problem:  # a dry run only plans: say it, the real run stops here
                    print(f"growlm: warning: corpus.sources[{i}] ({source['name']}): {problem}", file=sys.stderr)
    changed, made_by = outputs.drift(R, config)
    if changed:
        keys = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        print(
            f"growlm: warning: {R}/ holds the experiment '{EXPERIMENT}' made with other settings ({keys}; made by "
            f"{' '.join(made_by) or 'the default config'}); this run rebuilds what they change in place. To keep "
            f"both, give this one its own name: --config experiment=NAME (its results go to results/NAME/)",
            file=sys.stderr,
        )
    for warning in experiment_warnings(config, SWEEP, resolve_source=source_file, results=R):
        print(f"growlm: warning: {warning}", file=sys.stderr)


if MAIN_PROCESS:
    try:
        preflight()
    except GrowlmError as err:
        raise WorkflowError(str(err))
    # every task entry against lm-evaluation-harness's registry and the given folders (nothing to do
    # when evaluate.tasks is empty; the registry's names are cached per version of the harness)
    try:
        PROBLEMS = task_problems(config["evaluate"]["tasks"])
    except GrowlmError as err:
        PROBLEMS = [str(err)]
    if PROBLEMS:
        raise WorkflowError("config error: " + "; ".join(PROBLEMS))


onsuccess:
    # what made this folder's results, for the next run's warning about changed settings
    outputs.record(R, config, workflow.overwrite_configfiles or workflow.configfiles)
