# Corpus: each source is read (through datasets.load_dataset), cleaned and cut into units per
# split by its own job, in parallel; then each reading level merges its sources, without repeats.


rule download_source:
    output:
        "resources/downloads/{source}.txt",
    log:
        "results/logs/download_source/{source}.log",
    benchmark:
        "results/benchmarks/download_source/{source}.tsv"
    conda:
        "../envs/growlm.yaml"
    params:
        source=lambda wc: canonical(SOURCES[wc.source]),
    script:
        "../scripts/download_source.py"


rule prepare_source:
    input:
        source_input,
    output:
        expand("results/corpus/sources/{{source}}/{file}", file=SOURCE_FILES),
    log:
        "results/logs/prepare_source/{source}.log",
    benchmark:
        "results/benchmarks/prepare_source/{source}.tsv"
    conda:
        "../envs/growlm.yaml"
    threads: source_threads
    params:
        settings=lambda wc: source_settings(config, SOURCES[wc.source]),
    script:
        "../scripts/prepare_source.py"


rule build_level:
    input:
        level_sources,
    output:
        train="results/corpus/level{level}/train.txt",
        val="results/corpus/level{level}/val.txt",
        test="results/corpus/level{level}/test.txt",
        stats="results/corpus/level{level}/stats.json",
    log:
        "results/logs/build_level/level{level}.log",
    benchmark:
        "results/benchmarks/build_level/level{level}.tsv"
    conda:
        "../envs/growlm.yaml"
    params:
        names=level_source_names,
    script:
        "../scripts/build_level.py"
