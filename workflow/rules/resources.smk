# What each job asks of the machine: cores (threads), GPUs, memory and run time, from the config's
# `resources` and `corpus.threads` sections; scaled by the attempt on retries. No rules here.

import os

from growlm import launch
from growlm.gpus import SLOTS_ENV, machine_gpus, pool_problem, slots_per_gpu

# A local run shares this machine's GPUs among its jobs, also inside a SLURM allocation: a job that asks
# for GPUs (its `gpu` resource) claims devices of its own when it starts (growlm.gpus), and Snakemake runs
# at most as many GPU jobs at once as the machine has GPUs (k per GPU with resources.gpu_share the number
# 1/k, 0.5 for two). `--resources gpu=N` on the command line or in a profile sets another count. A job the SLURM
# executor submits has the GPUs the scheduler gave it. What the jobs inherit: growlm.launch.run_environment.
os.environ[SLOTS_ENV] = str(slots_per_gpu(config["resources"]["gpu_share"]))
for _name, _value in launch.run_environment(EXECUTOR, MAIN_PROCESS).items():
    if _value is None:
        os.environ.pop(_name, None)
    else:
        os.environ[_name] = _value
if MAIN_PROCESS and EXECUTOR == "local" and pool_problem():  # a device twice, or no device id: before any job
    raise WorkflowError(f"config error: {pool_problem()}")
MACHINE_GPUS = machine_gpus() if MAIN_PROCESS and EXECUTOR == "local" else []
if MACHINE_GPUS and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", len(MACHINE_GPUS) * slots_per_gpu(config["resources"]["gpu_share"]))


def prep_threads(wildcards=None):
    """Cores of a corpus job: corpus.threads, or all of --cores."""
    return config["corpus"]["threads"] or workflow.cores


def source_threads(wildcards):
    """A bundled book or a small file is one document: one core; anything else gets prep_threads."""
    files = source_input(wildcards)
    if files and sum(os.path.getsize(f) for f in files if os.path.isfile(f)) < 8 << 20:
        return 1
    return prep_threads()


def training_resources():
    """The resources of every training job (growlm.launch.training_resources, which says how a job
    gets its devices and processes)."""
    return launch.training_resources(config["resources"], config["train"]["threads"])


def check_resources():
    """Every rule's resources as Snakemake resolved them (the config's, a profile's, --set-resources), checked
    before the first job and in a dry run (growlm.launch.resource_problems); the Snakefile calls it once its
    rules are defined."""
    rules = {
        r.name: {k: str(v._value) if isinstance(v._value, str) else v.raw for k, v in r.resources.items()}
        for r in workflow.rules
    }
    problems = launch.resource_problems(rules, EXECUTOR)
    if MAIN_PROCESS and problems:
        many = f"{len(problems)} problems:\n  - " if len(problems) > 1 else ""
        raise WorkflowError("resources error: " + many + "\n  - ".join(problems))


def evaluation_resources():
    """An evaluation job runs its model on the GPU when there is one, so it counts as a GPU job: at
    most one GPU (evaluation runs in one process), none when the training jobs ask for none."""
    return dict(gpu=launch.one_process_gpus(config["resources"]))
