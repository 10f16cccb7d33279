# Corpus: each source is read (through datasets.load_dataset), cleaned and cut into units per
# split by its own job, in parallel; then each reading level merges its sources, without repeats.


rule download_source:
    output:
        res("downloads/{source}.txt"),
    log:
        res("logs/download_source/{source}.log"),
    benchmark:
        res("benchmarks/download_source/{source}.tsv")
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
        expand(res("corpus/sources/{{source}}/{file}"), file=SOURCE_FILES),
    log:
        res("logs/prepare_source/{source}.log"),
    benchmark:
        res("benchmarks/prepare_source/{source}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: source_threads
    params:
        settings=source_params,
    script:
        "../scripts/prepare_source.py"


rule build_level:
    input:
        level_sources,
    output:
        train=res("corpus/level{level}/train.txt"),
        val=res("corpus/level{level}/val.txt"),
        test=res("corpus/level{level}/test.txt"),
        stats=res("corpus/level{level}/stats.json"),
    log:
        res("logs/build_level/level{level}.log"),
    benchmark:
        res("benchmarks/build_level/level{level}.tsv")
    conda:
        "../envs/growlm.yaml"
    params:
        names=level_source_names,
    script:
        "../scripts/build_level.py"
