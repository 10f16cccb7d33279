"""Entry script of rule clean_level: one reading level's sources -> train/val/test sentences."""
from pathlib import Path

from growlm.errors import job_log
from growlm.jobs.corpus import clean_level

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    clean_level(list(sm.input), sm.params.names, int(sm.wildcards.level), Path(sm.output.train).parent,
                sm.output.stats, sm.params.corpus)
