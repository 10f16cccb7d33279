# One byte-level BPE tokenizer for every model, fitted on all levels' training splits; then each
# split is encoded once into a flat token file that every training job memory-maps.


rule fit_tokenizer:
    input:
        expand("results/corpus/level{level}/train.txt", level=LEVELS),
    output:
        "results/tokenizer/tokenizer.json",
        "results/tokenizer/tokenizer_config.json",
    log:
        "results/logs/fit_tokenizer.log",
    benchmark:
        "results/benchmarks/fit_tokenizer.tsv"
    conda:
        "../envs/growlm.yaml"
    params:
        vocab_size=config["tokenizer"]["vocab_size"],
        min_frequency=config["tokenizer"]["min_frequency"],
        max_length=config["model"]["context"],
    script:
        "../scripts/fit_tokenizer.py"


rule encode_split:
    input:
        text="results/corpus/level{level}/{split}.txt",
        tokenizer="results/tokenizer/tokenizer.json",
    output:
        "results/tokens/level{level}/{split}.npy",
    log:
        "results/logs/encode_split/level{level}_{split}.log",
    benchmark:
        "results/benchmarks/encode_split/level{level}_{split}.tsv"
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/encode_split.py"
