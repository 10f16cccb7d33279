"""Entry script of rule train_baseline: M_0 of width d1 from scratch on level 1."""
from pathlib import Path

import torch

from growlm.jobs import job_log, train_from_scratch

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "train_baseline"):
    torch.set_num_threads(sm.threads)
    seed = int(sm.wildcards.seed)
    train_from_scratch(config=sm.config, stage="large", n_embd=int(sm.wildcards.d1), n_layer=int(sm.wildcards.L1),
                       seed=seed, init_seed=seed, tokens=int(sm.wildcards.budget), lr=float(sm.wildcards.lr), train_file=sm.input.train, val_file=sm.input.val,
                       tokenizer_dir=Path(sm.input.tokenizer).parent, out_dir=Path(sm.output.model).parent,
                       role="baseline M_0")
