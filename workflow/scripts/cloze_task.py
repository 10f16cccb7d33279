"""Entry script of rule cloze_task: growlm's cloze task with its data from the level's test split."""
from pathlib import Path

from growlm.errors import job_log
from growlm.jobs.evaluate import cloze_task

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    cloze_task(template_dir=Path(sm.input.template).parent, test_text=sm.input.test,
               out_dir=Path(sm.output.yaml).parent)
