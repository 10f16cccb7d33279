"""Entry script of rule report_tasks: every model's task scores as a CSV, a table and a figure."""
from growlm.task_table import task_table
from growlm.errors import job_log
from growlm.report import tasks_html, tasks_plot

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    table = task_table(sm.params.combos, sm.params.paths, sm.input.tasks, pretrained=sm.params.get("pretrained"))
    table.to_csv(sm.output.csv, index=False)
    tasks_html(table, sm.output.html)
    tasks_plot(table, sm.output.svg)
