"""The Snakemake report: its first page (the answer, a sentence per arm), figures and tables.

One module per concern: `tables` (HTML pages), `figures` (SVG plots), `summary` (the first page's
sentences). The entry scripts import what they draw from here.
"""

from growlm.report.figures import (
    answer_figure,
    answer_plot,
    budget_plot,
    cost_ratio_plot,
    loss_vs_flops_figure,
    loss_vs_flops_plot,
    savings_plot,
    scaling_plot,
    tasks_plot,
    trend_plot,
)
from growlm.report.summary import (budget_sentences, mode_sentences, summary_sentences, task_sentences,
                                   trend_sentences, write_summary)
from growlm.report.tables import (
    COMPARISON_COLUMNS,
    comparison_html,
    corpus_stats_table,
    plans_html,
    profile_html,
    task_failures,
    task_score_columns,
    tasks_html,
    test_level,
)

__all__ = [
    "COMPARISON_COLUMNS",
    "answer_figure",
    "answer_plot",
    "budget_plot",
    "budget_sentences",
    "comparison_html",
    "corpus_stats_table",
    "cost_ratio_plot",
    "loss_vs_flops_figure",
    "loss_vs_flops_plot",
    "mode_sentences",
    "plans_html",
    "profile_html",
    "savings_plot",
    "scaling_plot",
    "summary_sentences",
    "task_failures",
    "task_score_columns",
    "task_sentences",
    "tasks_html",
    "tasks_plot",
    "test_level",
    "trend_plot",
    "trend_sentences",
    "write_summary",
]
