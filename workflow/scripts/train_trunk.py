"""Entry script of rule train_trunk: the members' shared trunk (members.trunk > 0), on all of their text."""
from pathlib import Path

import torch

from growlm.errors import job_log
from growlm.launch import job_devices
from growlm.jobs.train import live_curves
from growlm.jobs.train import train_model

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule), job_devices(sm.resources, sm.rule), live_curves(sm.params.live):  # train.log_to
    torch.set_num_threads(sm.threads)
    train_model(train=sm.params.train, model=sm.params.model, init_seed=sm.params.init_seed,
                role="the members' shared trunk", train_file=sm.input.train, val_file=sm.input.val,
                tokenizer_dir=Path(sm.input.tokenizer).parent, out_dir=Path(sm.output.model).parent,
                memory_limit_gb=sm.params.memory_limit_gb, **sm.params.how)  # gpus, gpu_share, compile
