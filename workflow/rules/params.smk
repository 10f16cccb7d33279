# What each job reads besides its files: the params of the rules, resolved by growlm.experiment
# from the config sections each job depends on (Snakemake reruns a job when they change; the
# functions of a job's output or resources here are left out of that trigger on purpose). The rules'
# own params lambdas use the growlm.experiment functions imported here too. No rules here.

import os
from pathlib import Path

from growlm.experiment import (
    canonical,
    grow_settings,
    large_settings,
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
from growlm.branches import baseline_branch, kept_steps, refine_branch
from growlm.methods import is_schedule


def level_source_names(wildcards):
    return [s["name"] for s in config["corpus"]["sources"] if str(s["level"]) == wildcards.level]


def small_train(wildcards):
    return member_train(config, seed=int(wildcards.seed), member=int(wildcards.member))


def trunk_train(wildcards):
    return member_train(config, seed=int(wildcards.seed), member=None)


def branch_from(wildcards, input):
    """The trunk's folder (a params function of the input: the input itself is the rerun trigger)."""
    return str(Path(input.trunk).parent) if trunk_tokens(config) else None


def baseline_train(wildcards):
    return large_settings(config, seed=int(wildcards.seed), tokens=int(wildcards.budget), optim=wildcards.lr)


def refine_train(wildcards):
    return refine_settings(
        config, wildcards.method, seed=int(wildcards.seed), tokens=int(wildcards.budget), lr=wildcards.lr
    )


def refine_ramps_of(wildcards):
    return refine_ramps(config, wildcards.method, budgets=SWEEP["budgets"], budget=int(wildcards.budget))


def refine_operators_of(wildcards):
    return refine_operators(config, wildcards.method, budgets=SWEEP["budgets"], budget=int(wildcards.budget))


def branches_kept(wildcards, output):
    """{point: step} of the states a large training job keeps for its cooldown branches: its `branch_*` outputs
    (growlm.branches.kept_steps). A params function of the output, so Snakemake leaves it out of the rerun
    trigger: a new point is a missing output, which reruns the job by itself, and the steps follow from the
    job's own settings."""
    kind = "refine" if "method" in wildcards.keys() else "baseline"
    points = {p: f for p, f in BRANCHES[kind].items() if f"branch_{p}" in output.keys()}
    return kept_steps(
        config,
        kind,
        seed=int(wildcards.seed),
        budget=int(wildcards.budget),
        lr=wildcards.lr,
        method=wildcards.get("method"),
        points=points,
    )


def baseline_branch_of(wildcards):
    return baseline_branch(
        config,
        seed=int(wildcards.seed),
        budget=int(wildcards.budget),
        optim=wildcards.lr,
        fraction=BRANCHES["baseline"][wildcards.point],
    )


def refine_branch_of(wildcards):
    return refine_branch(
        config,
        wildcards.method,
        seed=int(wildcards.seed),
        budget=int(wildcards.budget),
        lr=wildcards.lr,
        fraction=BRANCHES["refine"][wildcards.point],
        budgets=SWEEP["budgets"],
    )


def grow_params(wildcards):
    if is_schedule(wildcards.method):
        return schedule_settings(
            config, wildcards.method, n_embd=int(wildcards.d1), n_layer=int(wildcards.L1), seed=int(wildcards.seed)
        )
    plugins = plugin_files(config, wildcards.method)
    return {
        "members": source_dirs(wildcards),
        **grow_settings(config, wildcards.method),
        # a plugin file is known by its content (rules/inputs.smk), not its date
        **({"plugins": plugins, "plugins_content": content(plugins)} if plugins else {}),
    }


def pretrained_params():
    """{"pretrained": the members brought (members.pretrained), their stated cost (members.cost) and the
    context it is priced at} for the rules that price the members (growlm.compare.priced); nothing
    without pretrained members, so that members.cost then reruns nothing."""
    if not PRETRAINED_MEMBERS:
        return {}
    members = config["members"]
    return {
        "pretrained": {
            "sources": canonical(PRETRAINED_MEMBERS),
            "cost": members["cost"],
            "context": config["model"]["context"],
        }
    }


def live_settings(wildcards, output):
    """Where a training job writes its live curves (`train.log_to`; None: nowhere): one run per model
    under the experiment's live/ folder, named by the model's path under models/. A params function of
    the output, so Snakemake leaves it out of the rerun trigger: changing train.log_to reruns nothing."""
    if not config["train"]["log_to"]:
        return None
    name = os.path.relpath(str(Path(output.model).parent), res("models"))
    return {
        "to": list(config["train"]["log_to"]),
        "dir": res(f"live/{name}"),
        "name": name,
        "experiment": EXPERIMENT,
        **pretrained_params(),
    }  # a refinement's curves start at its members' stated cost


def job_how(wildcards, resources):
    """How a training job runs on what it was given, never what it computes: the GPUs it asked for on
    each node (torchrun with several), its nodes (one torchrun agent on each, resources.nodes) and the
    CPUs each node's task has, the share of each GPU's memory its planner may budget
    (`resources.gpu_share`), `train.compile`, `train.compile_ramps` and `train.sync_every`. The job
    passes them on as keyword arguments.

    This params function takes `resources`, so Snakemake counts it as derived from the job's
    resources and leaves it out of the params rerun trigger (Snakemake's rule for params that read
    input, output, threads or resources): changing how a job runs reruns nothing, as for
    `train.threads`. The checkpoint fingerprint leaves these out too (TrainConfig.HOW_FIELDS), so a
    run resumes under any of them."""
    return {
        **launch.job_launch(resources),  # gpus per node, nodes, cpus_per_task
        "gpu_share": float(config["resources"]["gpu_share"]),
        "compile": config["train"]["compile"],
        "compile_ramps": bool(config["train"]["compile_ramps"]),
        "sync_every": int(config["train"]["sync_every"]),
    }


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
