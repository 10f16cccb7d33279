# Evaluation: held-out metrics of every trained model on each level's test split, then the
# comparison of M_0 and each M_1: final losses and the FLOPs M_1 needs to reach M_0's final loss.


rule evaluate_model:
    input:
        model=res("models/{model}/model.safetensors"),
        tests=expand(res("tokens/level{level}/test.npy"), level=LEVELS),
    output:
        res("eval/{model}/metrics.json"),
    log:
        res("logs/evaluate_model/{model}.log"),
    benchmark:
        res("benchmarks/evaluate_model/{model}.tsv")
    wildcard_constraints:
        model=r"(small|baseline|refined|pretrained)/.+",
    conda:
        "../envs/growlm.yaml"
    threads: 1
    resources:
        **evaluation_resources(),
    params:
        levels=LEVELS,
        context=config["model"]["context"],
        max_tokens=config["evaluate"]["test_tokens"],
    script:
        "../scripts/evaluate_model.py"


rule evaluate_ensemble:
    input:
        models=lambda wc: [f"{d}/model.safetensors" for d in member_dirs(wc)],
        tests=expand(res("tokens/level{level}/test.npy"), level=LEVELS),
    output:
        ENSEMBLE,
    log:
        res("logs/evaluate_ensemble/d{d0}_L{L0}_n{n}_s{seed}.log"),
    benchmark:
        res("benchmarks/evaluate_ensemble/d{d0}_L{L0}_n{n}_s{seed}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: 1
    resources:
        **evaluation_resources(),
    params:
        members=member_dirs,
        levels=LEVELS,
        context=config["model"]["context"],
        max_tokens=config["evaluate"]["test_tokens"],
    script:
        "../scripts/evaluate_ensemble.py"


rule compare:
    input:
        metrics=eval_targets(),
        ledgers=[f"{d}/ledger.csv" for d in trained_dirs()],
        growth=[f"{d}/growth.json" for d in grown_dirs()],
        ensembles=ensemble_targets(),
        unigram=f"{R}/tokens/level{EVAL_LEVEL}/train.npy",
        unigram_test=f"{R}/tokens/level{EVAL_LEVEL}/test.npy",
    output:
        comparison=res("eval/comparison.csv"),
        curves=res("eval/curves.csv"),
        lr_sweep=res("eval/lr_sweep.csv"),
    log:
        res("logs/compare.log"),
    benchmark:
        res("benchmarks/compare.tsv")
    conda:
        "../envs/growlm.yaml"
    params:
        combos=combos(),
        paths={
            "small": SMALL,
            "baseline": BASELINE,
            "grown": GROWN,
            "refined": REFINED,
            "ensemble": ENSEMBLE if config["controls"]["ensemble"] else None,
        },
        vocab_size=config["tokenizer"]["vocab_size"],
        levels=ARM_LEVELS,
    script:
        "../scripts/compare.py"
