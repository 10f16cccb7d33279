"""Entry script of rule grow: the members -> M'_1."""
from pathlib import Path

import torch

from growlm.jobs import grow, job_log

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "grow"):
    torch.set_num_threads(sm.threads)
    grow(member_dirs=sm.params.members, method=sm.wildcards.method, n_embd=int(sm.wildcards.d1),
         n_layer=int(sm.wildcards.L1), seed=int(sm.wildcards.seed), options=dict(sm.params.options),
         out_dir=Path(sm.output[0]).parent)
