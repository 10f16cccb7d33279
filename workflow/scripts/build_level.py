"""Entry script of rule build_level: one reading level's prepared sources -> train/val/test units."""
from pathlib import Path

from growlm.errors import job_log
from growlm.jobs.corpus import build_level

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    build_level(sm.wildcards.level, sm.params.names, [Path(f).parent for f in sm.input if f.endswith("source.json")],
                out_dir=Path(sm.output.train).parent, stats_file=sm.output.stats)
