"""Entry script of rule download_source: a URL source, downloaded and checked against its sha256."""
from growlm.errors import job_log
from growlm.jobs.corpus import download_source

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    download_source(sm.params.source, sm.output[0])
