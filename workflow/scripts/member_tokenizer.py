"""Entry script of rule member_tokenizer: the pretrained members' one tokenizer, for the corpus."""
from pathlib import Path

from growlm.errors import job_log
from growlm.jobs.tokenizer import member_tokenizer

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    member_tokenizer([Path(sm.input.imported).parent], Path(sm.output[0]).parent)
