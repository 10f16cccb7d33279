"""Entry script of rule report_figures."""
from growlm.errors import job_log
from growlm.report import comparison_html, cost_ratio_plot, loss_vs_flops_plot, write_summary

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    loss_vs_flops_plot(sm.input.curves, sm.input.comparison, sm.output.loss)
    cost_ratio_plot(sm.input.comparison, sm.output.ratio)
    comparison_html(sm.input.comparison, sm.output.table, sm.input.lr_sweep)
    write_summary(sm.input.comparison, sm.input.description, sm.output.summary)
