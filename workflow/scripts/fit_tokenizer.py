"""Entry script of rule fit_tokenizer."""
from pathlib import Path

from growlm.errors import job_log
from growlm.jobs.tokenizer import fit_tokenizer

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    fit_tokenizer(list(sm.input), Path(sm.output[0]).parent, vocab_size=sm.params.vocab_size,
                  min_frequency=sm.params.min_frequency, max_length=sm.params.max_length)
