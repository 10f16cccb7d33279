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
        savings=res("eval/savings.csv"),
        description=shipped("../report/workflow.rst"),
        tasks=[res("eval/tasks.csv")] if TASKS else [],
    output:
        summary=res("report/summary.rst"),
        answer=res("report/answer.svg"),  # the first page's figure, inside summary.rst too
        savings=res("report/savings.svg"),  # beside it: the saving at each loss (empty without envelopes)
        trend=res("report/trend.svg"),  # the multiplier's trend over sizes (empty with fewer than two sizes)
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
    params:
        predict=config["predict"],  # the size and budget the first page's trend is read at (none: no prediction)
    script:
        "../scripts/report_figures.py"


# the lm-evaluation-harness scores of every model (evaluate.tasks): one row per model, task and metric,
# with the model's training FLOPs (an M_1's members and growth included), a table and a figure
rule report_tasks:
    input:
        tasks=task_targets(),
        ledgers=[f"{d}/ledger.csv" for d in trained_dirs()],  # an imported member's cost: in its folder's growlm.json
        models=[f"{d}/model.safetensors" for d in model_dirs()],
        growth=[f"{d}/growth.json" for d in grown_dirs()],
    output:
        csv=res("eval/tasks.csv"),
        html=report(
            res("report/tasks.html"),
            caption="../report/tasks.rst",
            category="5. Benchmark tasks",
        ),
        svg=report(
            res("report/tasks.svg"),
            caption="../report/tasks_vs_flops.rst",
            category="5. Benchmark tasks",
        ),
    log:
        res("logs/report_tasks.log"),
    benchmark:
        res("benchmarks/report_tasks.tsv")
    conda:
        "../envs/growlm.yaml"
    params:
        **pretrained_params(),  # the members brought and their stated cost (members.cost)
        combos=combos(),
        paths={"small": SMALL, "baseline": BASELINE, "grown": GROWN, "refined": REFINED},
    script:
        "../scripts/report_tasks.py"


# with several budgets: each arm's cost ratio against M_0's budget
rule budget_plot:
    input:
        res("eval/comparison.csv"),
    output:
        report(
            res("report/cost_vs_budget.svg"),
            caption="../report/cost_vs_budget.rst",
            category="3. Comparison",
        ),
    log:
        res("logs/budget_plot.log"),
    benchmark:
        res("benchmarks/budget_plot.tsv")
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/budget_plot.py"


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
