"""Entry script of rule profile: a few training steps of one model kind under nsys or ncu."""
from pathlib import Path

from growlm.errors import job_log
from growlm.launch import job_devices
from growlm.jobs.profile import profile

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule), job_devices(sm.resources, sm.rule):
    p = sm.params.profile
    profile(tool=sm.wildcards.tool, kind=sm.wildcards.kind, train=p["train"], model=p["model"],
            tokens_file=sm.input.tokens, tokenizer_dir=Path(sm.input.tokenizer).parent,
            out_dir=Path(sm.output.summary).parent, settings=p["settings"], grown_dir=p["grown"], threads=sm.threads)
