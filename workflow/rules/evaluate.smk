# Evaluation: held-out metrics of every trained model on each level's test split, then the
# comparison of M_0 and each M_1: final losses and the FLOPs M_1 needs to reach M_0's final loss.


rule evaluate_model:
    input:
        model="results/models/{model}/model.safetensors",
        tests=expand("results/tokens/level{level}/test.npy", level=LEVELS),
    output:
        "results/eval/{model}/metrics.json",
    params:
        levels=LEVELS,
        context=config["model"]["context"],
        max_tokens=config["evaluate"]["test_tokens"],
    wildcard_constraints:
        model=r"(small|baseline|refined)/.+",
    threads: 1
    log:
        "results/logs/evaluate_model/{model}.log",
    benchmark:
        "results/benchmarks/evaluate_model/{model}.tsv"
    conda:
        "../../envs/growlm.yaml"
    script:
        "../scripts/evaluate_model.py"


rule compare:
    input:
        metrics=eval_targets(),
        ledgers=[f"{d}/ledger.csv" for d in model_dirs()],
        growth=[f"{d}/growth.json" for d in grown_dirs()],
        unigram="results/tokens/level1/train.npy",
        unigram_test="results/tokens/level1/test.npy",
    output:
        comparison="results/eval/comparison.csv",
        curves="results/eval/curves.csv",
    params:
        combos=combos(),
        paths={"small": SMALL, "baseline": BASELINE, "grown": GROWN, "refined": REFINED},
        vocab_size=config["tokenizer"]["vocab_size"],
    log:
        "results/logs/compare.log",
    benchmark:
        "results/benchmarks/compare.tsv"
    conda:
        "../../envs/growlm.yaml"
    script:
        "../scripts/compare.py"
