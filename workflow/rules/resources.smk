# What each job asks of the machine: cores (threads), GPUs, memory and run time, from the config's
# `resources` and `corpus.threads` sections; scaled by the attempt on retries. No rules here.

import os


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
    """The resources every training rule asks for (scaled by the attempt on retries)."""
    res = config["resources"]
    return dict(
        gpu=res["gpu"],
        cpus_per_gpu=res["cpus_per_gpu"],
        mem_mb=lambda wc, attempt: res["mem_mb"] * attempt,
        runtime=lambda wc, attempt: res["runtime"] * attempt,
    )


def evaluation_resources():
    """An evaluation job runs its model on the GPU when there is one, so it counts as a GPU job: at
    most one GPU (evaluation runs in one process), none when the training jobs ask for none."""
    return dict(gpu=min(1, config["resources"]["gpu"]))
