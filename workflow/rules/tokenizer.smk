# One byte-level BPE tokenizer for every model, fitted on all levels' training splits; then each
# split is encoded once into a flat token file that every training job memory-maps.


if PRETRAINED_MEMBERS:

    # members.pretrained: the members' own tokenizer (one for all of them, checked before any job)
    # encodes the corpus; member 1's copy, rerun only when member 1's tokenizer files change (its
    # `tokenizer` part, rules/inputs.smk), in the same run that reimports it
    rule member_tokenizer:
        input:
            imported=ancient(f"{PRETRAINED.format(member=1)}/tokenizer.json"),
            part=MEMBER_PART.format(part="tokenizer"),
        output:
            res("tokenizer/tokenizer.json"),
            res("tokenizer/tokenizer_config.json"),
        log:
            res("logs/member_tokenizer.log"),
        benchmark:
            res("benchmarks/member_tokenizer.tsv")
        conda:
            "../envs/growlm.yaml"
        script:
            "../scripts/member_tokenizer.py"

    ruleorder: member_tokenizer > fit_tokenizer

    localrules:
        member_tokenizer,


rule fit_tokenizer:
    input:
        expand(res("corpus/level{level}/train.txt"), level=LEVELS),
    output:
        res("tokenizer/tokenizer.json"),
        res("tokenizer/tokenizer_config.json"),
    log:
        res("logs/fit_tokenizer.log"),
    benchmark:
        res("benchmarks/fit_tokenizer.tsv")
    conda:
        "../envs/growlm.yaml"
    params:
        vocab_size=config["tokenizer"]["vocab_size"],
        min_frequency=config["tokenizer"]["min_frequency"],
        max_length=config["model"]["context"],
    script:
        "../scripts/fit_tokenizer.py"


# A checkpoint: Snakemake plans the whole run before any job, so a job after tokens it re-encodes is planned to
# run, though the tokens may come out as they were (an edited level-1 book refits the tokenizer, which level 0's
# tokens rarely notice). After each encoding Snakemake plans the rest again, and a model whose token files and
# tokenizer have the content it was trained on is not trained again (the workflow profile has Snakemake compare
# an input newer than a job's outputs by its checksum with the one recorded when the job ran, at any size).
checkpoint encode_split:
    input:
        text=res("corpus/level{level}/{split}.txt"),
        stats=res("corpus/level{level}/stats.json"),
        tokenizer=res("tokenizer/tokenizer.json"),
    output:
        tokens=res("tokens/level{level}/{split}.npy"),
        sources=res("tokens/level{level}/{split}.npy.sources.json"),
    log:
        res("logs/encode_split/level{level}_{split}.log"),
    benchmark:
        res("benchmarks/encode_split/level{level}_{split}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: prep_threads
    params:
        caps=lambda wc: split_caps(config, wc.level, wc.split),
    script:
        "../scripts/encode_split.py"


# A training set drawn from several levels (levels.members or levels.large naming more than one).
rule mix_levels:
    input:
        lambda wc: [f"{R}/tokens/level{v}/{wc.split}.npy" for v in wc.levels.split("+")],
    output:
        tokens=res("tokens/level{levels}/{split}.npy"),
        sources=res("tokens/level{levels}/{split}.npy.sources.json"),
    log:
        res("logs/mix_levels/level{levels}_{split}.log"),
    benchmark:
        res("benchmarks/mix_levels/level{levels}_{split}.tsv")
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/mix_levels.py"
