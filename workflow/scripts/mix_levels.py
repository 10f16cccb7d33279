"""Entry script of rule mix_levels: one token file from several levels' files, one after another."""
from growlm.errors import job_log
from growlm.jobs.tokenizer import mix_levels

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    mix_levels(list(sm.input), sm.output.tokens)
