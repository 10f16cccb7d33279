# The experiment's config, checked before anything else: every value, every combination of the
# sweep and every source (growlm.validate), and what the other files build on: the sweep, the
# results folder, the reading levels, the sources, the methods (with their single-member
# controls), the plugin files and the benchmark tasks. Also this workflow's own copy of growlm on
# sys.path and the command line you ran. Included first. No rules here.

import os
import sys
from pathlib import Path

from snakemake.cli import get_argument_parser
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# this workflow's own copy of the library (also when it is used as a module, e.g. after snakedeploy), here
# and in every job: Snakemake puts a script's folder after site-packages, where another growlm (an
# editable install of another checkout, a pip-installed growlm) would win; the jobs inherit PYTHONPATH
# with it first, and stop naming both if another copy still runs (growlm.errors.job_log)
RULES_DIR = str(workflow.current_basedir)  # this folder, also when growlm runs as another workflow's module
sys.path.insert(0, str(Path(RULES_DIR).parent / "scripts"))

from growlm.errors import export_library  # noqa: E402

export_library(Path(RULES_DIR).parent / "scripts")

from growlm import hints, launch, outputs  # noqa: E402
from growlm.config_values import config_tag_problems  # noqa: E402
from growlm.errors import GrowlmError  # noqa: E402
from growlm.experiment import arm_levels, level_names  # noqa: E402
from growlm.sources import MIRROR_ENV  # noqa: E402
from growlm.methods import SINGLE_MEMBER, method_id, needs_single_member_control  # noqa: E402
from growlm.tasks import task_specs  # noqa: E402
from growlm.validate import check_config, nodes_problem  # noqa: E402

# every command growlm prints for you to run is your own command line (growlm.hints): the jobs
# inherit it through the environment
COMMAND = hints.export_command(sys.argv, hints.option_table(get_argument_parser()))
MAIN_PROCESS = not hints.is_job_step(sys.argv)  # not one job's step (a SLURM job parses this file again)
DRY_RUN = "dryrun" in COMMAND["given"]


# the executor that runs the jobs ("local", "slurm", ...), or None when Snakemake runs through its Python API
# from another program: growlm.launch.snakemake_executor
EXECUTOR = launch.snakemake_executor(workflow, sys.argv)


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


# a YAML tag in a --config value is dropped by Snakemake's reading: said, not run with what is left
TAGGED = config_tag_problems(sys.argv) if MAIN_PROCESS else []
if TAGGED:
    raise WorkflowError(f"config error: {TAGGED[0]}")

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
if MAIN_PROCESS and nodes_problem(config, EXECUTOR):  # jobs across nodes need SLURM
    raise WorkflowError(f"config error: {nodes_problem(config, EXECUTOR)}")
# corpus.mirror: the folder downloads are read from, passed to the jobs through their environment (never a
# rule's params: where a checked download comes from changes nothing it computes, so it reruns nothing)
if config["corpus"]["mirror"]:
    os.environ[MIRROR_ENV] = os.path.abspath(config["corpus"]["mirror"])

# the experiment's folder: results/ for the default experiment, results/<experiment>/ for any other
EXPERIMENT = config["experiment"]
R = outputs.results_dir(EXPERIMENT)


def res(path):
    """A path inside this experiment's results folder."""
    return f"{R}/{path}"


LEVELS = level_names(config)
ARM_LEVELS = arm_levels(config)
EVAL_LEVEL = ARM_LEVELS["evaluate"]
SPLITS = ["train", "val", "test"]
SOURCES = {s["name"]: s for s in config["corpus"]["sources"]}
METHOD_IDS = [method_id(m) for m in SWEEP["methods"]]
PLUGINS = config["grow"]["plugins"]  # your own operators (growlm.plugins), declared by check_config
PRETRAINED_MEMBERS = config["members"].get("pretrained") or []  # members.pretrained: imported, not trained

if config["controls"]["single_member"]:
    # single-source chains and the schedules already use m_1 alone (or no member): no duplicate arm
    METHOD_IDS += [m + SINGLE_MEMBER for m in METHOD_IDS if needs_single_member_control(m)]

# the benchmark tasks of evaluate.tasks (lm-evaluation-harness), one job per model and task entry;
# growlm's own tasks (growlm.tasks.BUNDLED) are written into the experiment's tasks/ folder, data included
TASKS = {spec["id"]: spec for spec in task_specs(config["evaluate"]["tasks"], bundled_dir=res("tasks"))}
