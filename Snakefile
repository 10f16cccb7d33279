# growlm: grow a large GPT-2 from n small trained ones, and measure whether it pays.
# Run:    snakemake --cores 2            (the default experiment of config.yaml)
# Report: snakemake --report results/report.html

from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# Cheap bookkeeping runs on the submitting host, not as cluster jobs.
localrules:
    all,
    fetch_source,
    corpus_stats,
    compare,
    report_figures,
    profile_report,
    plans_table,


include: "workflow/rules/corpus.smk"
include: "workflow/rules/tokenizer.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/grow.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        "results/eval/comparison.csv",
        "results/report/loss_vs_flops.svg",
        "results/report/comparison.html",
        "results/report/cost_ratio.svg",
        "results/report/profile.html",
        "results/report/plans.html",
        "results/report/corpus_stats.html",
