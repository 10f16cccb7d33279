"""Entry script of rule report_figures."""
import pandas as pd

from growlm.errors import job_log
from growlm.report import (answer_plot, comparison_html, cost_ratio_plot, loss_vs_flops_plot, savings_plot,
                           scaling_plot, trend_plot, write_summary)

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    loss_vs_flops_plot(sm.input.curves, sm.input.comparison, sm.output.loss)
    cost_ratio_plot(sm.input.comparison, sm.output.ratio)
    comparison_html(sm.input.comparison, sm.output.table, sm.input.lr_sweep)
    scaling_plot(pd.read_csv(sm.input.comparison), sm.output.scaling)  # cost ratio against d1
    answer_plot(sm.input.curves, sm.input.comparison, sm.output.answer)  # the first page's figure
    savings_plot(sm.input.savings, sm.input.comparison, sm.output.savings)  # beside it: the saving at each loss
    trend_plot(sm.input.comparison, sm.output.trend, sm.params.predict)  # with two or more sizes: the trend
    write_summary(sm.input.comparison, sm.input.description, sm.output.summary, figure_svg=sm.output.answer,
                  savings_svg=sm.output.savings, trend_svg=sm.output.trend, predict=sm.params.predict,
                  tasks_csv=sm.input.tasks[0] if sm.input.tasks else None)  # evaluate.tasks: their scores
