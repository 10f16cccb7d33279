"""Entry script of rule prepare_source: one source -> cleaned units per split, with its provenance."""
from pathlib import Path

from growlm.errors import job_log
from growlm.jobs.corpus import prepare_source

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    prepare_source(sm.params.settings, inputs=list(sm.input), out_dir=Path(sm.output[0]).parent, threads=sm.threads)
