# What needs the network, fetched in one run where there is one (`snakemake --cores all prepare`, with
# the experiment's --configfile), so that the rest of the workflow runs where there is none (compute
# nodes; growlm.hub): every Hub dataset of corpus.sources read into the experiment's results, every
# Hub member of members.pretrained imported (its files stay in the Hub's cache, HF_HOME), and the
# documents of every benchmark task of evaluate.tasks loaded into that cache. Nothing here trains.


rule prepare:
    input:
        prepare_targets(),
    log:
        res("logs/prepare.log"),
    run:
        say_prepared(len(input), log[0])


# A benchmark task's documents, loaded once as lm-evaluation-harness loads them (into the Hub's cache).
rule fetch_task_data:
    output:
        res("tasks/data/{task}.json"),
    log:
        res("logs/fetch_task_data/{task}.log"),
    wildcard_constraints:
        task="|".join(re.escape(t) for t in TASKS) or "(?!)",
    conda:
        "../envs/growlm.yaml"
    params:
        spec=lambda wc: TASKS[wc.task],
    script:
        "../scripts/fetch_task_data.py"
