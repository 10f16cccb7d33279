"""Entry script of rule grow: the members -> M'_1 (or, for a schedule, M_0's own init -> M'_1)."""
from pathlib import Path

import torch

from growlm.errors import job_log
from growlm.launch import job_devices
from growlm.jobs.grow import grow, grow_schedule
from growlm.growth import load_plugins
from growlm.methods import is_schedule

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule), job_devices(sm.resources, sm.rule):
    torch.set_num_threads(sm.threads)
    p, wc = sm.params.grow, sm.wildcards
    out_dir, tokenizer_dir = Path(sm.output[0]).parent, Path(sm.input.tokenizer).parent
    if is_schedule(wc.method):  # what growlm.schedules registered under its name runs it
        grow_schedule(wc.method, p, seed=int(wc.seed), train_file=sm.input.data, val_file=sm.input.val,
                      tokenizer_dir=tokenizer_dir, out_dir=out_dir)
    else:
        load_plugins(p.get("plugins"))  # your own operators (grow.plugins), registered by their decorators
        grow(member_dirs=p["members"], method=wc.method, n_embd=int(wc.d1), n_layer=int(wc.L1), seed=int(wc.seed),
             options=p["options"], plugins=p.get("plugins"),
             data_file=sm.input.data, learned_batches=p.get("learned_batches"), out_dir=out_dir)
