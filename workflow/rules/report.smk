# Report: figures and tables embedded by `snakemake --report results/report.html`.


rule corpus_stats:
    input:
        expand("results/corpus/level{level}/stats.json", level=LEVELS),
    output:
        csv="results/corpus/stats.csv",
        html=report(
            "results/report/corpus_stats.html",
            caption="../report/corpus_stats.rst",
            category="1. Corpus",
        ),
    log:
        "results/logs/corpus_stats.log",
    benchmark:
        "results/benchmarks/corpus_stats.tsv"
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/corpus_stats.py"


rule report_figures:
    input:
        comparison="results/eval/comparison.csv",
        curves="results/eval/curves.csv",
        lr_sweep="results/eval/lr_sweep.csv",
        description=shipped("../report/workflow.rst"),
    output:
        summary="results/report/summary.rst",
        loss=report(
            "results/report/loss_vs_flops.svg",
            caption="../report/loss_vs_flops.rst",
            category="2. Training",
        ),
        ratio=report(
            "results/report/cost_ratio.svg",
            caption="../report/cost_ratio.rst",
            category="3. Comparison",
        ),
        table=report(
            "results/report/comparison.html",
            caption="../report/comparison.rst",
            category="3. Comparison",
        ),
        scaling=report(
            "results/report/scaling.svg",
            caption="../report/scaling.rst",
            category="3. Comparison",
        ),
    log:
        "results/logs/report_figures.log",
    benchmark:
        "results/benchmarks/report_figures.tsv"
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/report_figures.py"


rule plans_table:
    input:
        [f"{d}/plan.json" for d in model_dirs()],
    output:
        report(
            "results/report/plans.html",
            caption="../report/plans.rst",
            category="2. Training",
        ),
    log:
        "results/logs/plans_table.log",
    benchmark:
        "results/benchmarks/plans_table.tsv"
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/plans_table.py"
