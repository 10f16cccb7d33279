"""Entry script of rule refine: M'_1 -> M_1 on level 1."""
from pathlib import Path

import torch

from growlm.errors import job_log
from growlm.launch import job_devices
from growlm.jobs.train import live_curves
from growlm.jobs.train import refine

sm = snakemake  # noqa: F821 (injected by Snakemake)
grown = Path(sm.input.grown).parent
with job_log(sm.log[0], sm.rule), job_devices(sm.resources, sm.rule), \
        live_curves(sm.params.live, grown_dir=grown):  # train.log_to
    torch.set_num_threads(sm.threads)
    refine(train=sm.params.train, ramps=sm.params.ramps, grown_dir=grown, train_file=sm.input.train,
           val_file=sm.input.val, tokenizer_dir=Path(sm.input.tokenizer).parent, out_dir=Path(sm.output.model).parent,
           memory_limit_gb=sm.params.memory_limit_gb, refine_with=sm.params.refine_with,
           branches=sm.params.branches, **sm.params.how)  # gpus, gpu_share, compile: how it runs
