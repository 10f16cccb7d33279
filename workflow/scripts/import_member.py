"""Entry script of rule import_member: a pretrained member (members.pretrained), imported, not trained."""
from pathlib import Path

from growlm.errors import job_log
from growlm.jobs.train import import_member

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    import_member(sm.params.source, out_dir=Path(sm.output.model).parent, context=sm.params.context)
