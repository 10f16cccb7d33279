"""Entry script of rules fetch_source and download_source."""
from growlm.errors import job_log
from growlm.jobs.corpus import fetch_source

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    fetch_source(sm.params.source, sm.output[0], bundled=sm.input[0] if sm.rule == "fetch_source" else None)
