"""Entry script of rule profile_report."""
from growlm.errors import job_log
from growlm.report import profile_html

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "profile_report"):
    profile_html(list(sm.input.tables), sm.input.curves, sm.output[0])
