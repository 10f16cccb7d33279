"""Entry script of rule budget_plot: the cost ratio against M_0's budget (several budgets)."""
import pandas as pd

from growlm.errors import job_log
from growlm.report import budget_plot

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    budget_plot(pd.read_csv(sm.input[0]), sm.output[0])
