"""Entry script of rule encode_split."""
from pathlib import Path

from growlm.errors import job_log
from growlm.jobs.tokenizer import encode_split

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    encode_split(sm.input.text, Path(sm.input.tokenizer).parent, sm.output.tokens, stats_file=sm.input.stats,
                 split=sm.wildcards.split, caps=sm.params.caps, threads=sm.threads)
