# Report: figures and tables embedded by `snakemake --report results/report.html`.


rule corpus_stats:
    input:
        expand(res("corpus/level{level}/stats.json"), level=LEVELS),
    output:
        csv=res("corpus/stats.csv"),
        html=report(
            res("report/corpus_stats.html"),
            caption="../report/corpus_stats.rst",
            category="1. Corpus",
        ),
    log:
        res("logs/corpus_stats.log"),
    benchmark:
        res("benchmarks/corpus_stats.tsv")
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/corpus_stats.py"


rule report_figures:
    input:
        comparison=res("eval/comparison.csv"),
        curves=res("eval/curves.csv"),
        lr_sweep=res("eval/lr_sweep.csv"),
        description=shipped("../report/workflow.rst"),
    output:
        summary=res("report/summary.rst"),
        loss=report(
            res("report/loss_vs_flops.svg"),
            caption="../report/loss_vs_flops.rst",
            category="2. Training",
        ),
        ratio=report(
            res("report/cost_ratio.svg"),
            caption="../report/cost_ratio.rst",
            category="3. Comparison",
        ),
        table=report(
            res("report/comparison.html"),
            caption="../report/comparison.rst",
            category="3. Comparison",
        ),
        scaling=report(
            res("report/scaling.svg"),
            caption="../report/scaling.rst",
            category="3. Comparison",
        ),
    log:
        res("logs/report_figures.log"),
    benchmark:
        res("benchmarks/report_figures.tsv")
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/report_figures.py"


rule plans_table:
    input:
        [f"{d}/plan.json" for d in trained_dirs()],
    output:
        report(
            res("report/plans.html"),
            caption="../report/plans.rst",
            category="2. Training",
        ),
    log:
        res("logs/plans_table.log"),
    benchmark:
        res("benchmarks/plans_table.tsv")
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/plans_table.py"
