"""Entry script of rule corpus_stats."""
from growlm.errors import job_log
from growlm.report import corpus_stats_table

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "corpus_stats"):
    corpus_stats_table(list(sm.input), csv_file=sm.output.csv, html_file=sm.output.html)
