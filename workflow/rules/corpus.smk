# Corpus: fetch (copy a bundled book or download a checked one), then clean, split into
# sentences and into train/val/test per reading level.


rule fetch_source:
    input:
        source_input,
    output:
        "results/corpus/sources/{source}.txt",
    log:
        "results/logs/fetch_source/{source}.log",
    benchmark:
        "results/benchmarks/fetch_source/{source}.tsv"
    conda:
        "../envs/growlm.yaml"
    params:
        source=lambda wc: canonical(SOURCES[wc.source]),
    script:
        "../scripts/fetch_source.py"


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
        "../scripts/fetch_source.py"


rule clean_level:
    input:
        level_sources,
    output:
        train="results/corpus/level{level}/train.txt",
        val="results/corpus/level{level}/val.txt",
        test="results/corpus/level{level}/test.txt",
        stats="results/corpus/level{level}/stats.json",
    log:
        "results/logs/clean_level/level{level}.log",
    benchmark:
        "results/benchmarks/clean_level/level{level}.tsv"
    conda:
        "../envs/growlm.yaml"
    params:
        corpus=corpus_settings(),
        names=lambda wc: [s["name"] for s in config["corpus"]["sources"] if int(s["level"]) == int(wc.level)],
    script:
        "../scripts/clean_level.py"
