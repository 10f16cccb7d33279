"""Entry script of rules cooldown_baseline and cooldown_refine: a cooldown branch of M_0 or of a refinement."""
from pathlib import Path

import torch

from growlm.errors import job_log
from growlm.jobs.train import cooldown
from growlm.launch import job_devices

sm = snakemake  # noqa: F821 (injected by Snakemake)
files = dict(train_file=sm.input.train, val_file=sm.input.val, tokenizer_dir=Path(sm.input.tokenizer).parent,
             memory_limit_gb=sm.params.memory_limit_gb)
how = dict(sm.params.how)  # gpus, nodes, cpus_per_task: the launch; the rest: how the steps run
launch = {k: how.pop(k) for k in ("gpus", "nodes", "cpus_per_task")}
with job_log(sm.log[0], sm.rule), job_devices(sm.resources, sm.rule):
    torch.set_num_threads(sm.threads)
    if sm.rule == "cooldown_refine":
        start = dict(train=sm.params.train, grown_dir=Path(sm.input.grown).parent, ramps=sm.params.ramps,
                     refine_with=sm.params.refine_with, **files, **how)
    else:
        start = dict(train=sm.params.train, model=sm.params.model, init_seed=int(sm.wildcards.seed),
                     role="baseline M_0", **files, **how)
    cooldown(kind="refine" if sm.rule == "cooldown_refine" else "baseline", branch=sm.params.branch,
             state_dir=sm.input.state, out_dir=Path(sm.output.record).parent, **launch, **start)
