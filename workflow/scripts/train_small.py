"""Entry script of rule train_small: member m_i of width d0 on level 0."""
from pathlib import Path

import torch

from growlm.experiment import member_seed
from growlm.jobs import job_log, train_from_scratch

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "train_small"):
    torch.set_num_threads(sm.threads)
    member, seed = int(sm.wildcards.member), int(sm.wildcards.seed)
    members = sm.params.members
    shard = ((member - 1) % members["shards"], members["shards"]) if members["data"] == "shards" else None
    train_from_scratch(config=sm.config, stage="small", n_embd=int(sm.wildcards.d0), n_layer=int(sm.wildcards.L0),
                       seed=member_seed(seed, member), init_seed=member_seed(seed, member),
                       train_file=sm.input.train, val_file=sm.input.val,
                       tokenizer_dir=Path(sm.input.tokenizer).parent, out_dir=Path(sm.output.model).parent,
                       shard=shard, role=f"small member m{member}")
