"""Entry script of rule refine: M'_1 -> M_1 on level 1."""
from pathlib import Path

import torch

from growlm.jobs import job_log, refine

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "refine"):
    torch.set_num_threads(sm.threads)
    refine(config=sm.config, grown_dir=Path(sm.input.grown).parent, seed=int(sm.wildcards.seed),
           tokens=int(sm.wildcards.budget), lr=float(sm.wildcards.lr),
           train_file=sm.input.train, val_file=sm.input.val, tokenizer_dir=Path(sm.input.tokenizer).parent,
           out_dir=Path(sm.output.model).parent)
