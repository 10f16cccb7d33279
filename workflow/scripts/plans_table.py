"""Entry script of rule plans_table."""
from growlm.errors import job_log
from growlm.report import plans_html

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "plans_table"):
    plans_html(list(sm.input), sm.output[0])
