"""Entry script of rule clean_level."""
from pathlib import Path

from growlm.jobs import clean_level, job_log

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "clean_level"):
    clean_level(list(sm.input), sm.params.names, int(sm.wildcards.level), Path(sm.output.train).parent,
                sm.output.stats, sm.params.corpus)
