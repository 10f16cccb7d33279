# Evaluation: held-out metrics of every trained model on each level's test split, its scores on the
# lm-evaluation-harness tasks of evaluate.tasks (none by default), then the comparison of M_0 and
# each M_1: final losses and the FLOPs M_1 needs to reach M_0's final loss.


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


# growlm's cloze task (evaluate.tasks: [growlm_cloze]): its YAML with its data, the last word of each
# held-out unit of the evaluated level, written beside it (growlm.tasks)
rule cloze_task:
    input:
        template=shipped("../resources/tasks/growlm_cloze/growlm_cloze.yaml"),
        test=res(f"corpus/level{EVAL_LEVEL}/test.txt"),
    output:
        yaml=res("tasks/growlm_cloze/growlm_cloze.yaml"),
        data=res("tasks/growlm_cloze/test.jsonl"),
    log:
        res("logs/cloze_task.log"),
    benchmark:
        res("benchmarks/cloze_task.tsv")
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/cloze_task.py"


# One task entry of evaluate.tasks on one model, through lm-evaluation-harness's API; a failed run is
# written as the record's error (the other results stay; the report names the task and the model).
rule evaluate_tasks:
    input:
        model=res("models/{model}/model.safetensors"),
        task=task_inputs,
    output:
        res("eval/{model}/tasks/{task}.json"),
    log:
        res("logs/evaluate_tasks/{model}/{task}.log"),
    benchmark:
        res("benchmarks/evaluate_tasks/{model}/{task}.tsv")
    wildcard_constraints:
        model=r"(small|pretrained|baseline|refined)/.+",
        task="|".join(re.escape(t) for t in TASKS) or "(?!)",
    conda:
        "../envs/growlm.yaml"
    threads: 1
    resources:
        **evaluation_resources(),
    params:
        spec=task_spec,
        limit=config["evaluate"]["task_limit"],
    script:
        "../scripts/evaluate_tasks.py"


rule compare:
    input:
        metrics=eval_targets(),
        ledgers=[f"{d}/ledger.csv" for d in trained_dirs()],
        before_decay=before_decay_models(),  # not read: asked for so that a member gaining it reruns
        growth=[f"{d}/growth.json" for d in grown_dirs()],
        ensembles=ensemble_targets(),
        branches=branch_targets(),
        unigram=f"{R}/tokens/level{EVAL_LEVEL}/train.npy",
        unigram_test=f"{R}/tokens/level{EVAL_LEVEL}/test.npy",
        large_train=f"{LARGE_TOKENS}/train.npy",
        members_train=f"{MEMBER_TOKENS}/train.npy",
        tasks=task_targets(),
    output:
        comparison=res("eval/comparison.csv"),
        curves=res("eval/curves.csv"),
        lr_sweep=res("eval/lr_sweep.csv"),
        savings=res("eval/savings.csv"),
    log:
        res("logs/compare.log"),
    benchmark:
        res("benchmarks/compare.tsv")
    conda:
        "../envs/growlm.yaml"
    params:
        **pretrained_params(),  # the members brought and their stated cost (members.cost): read here only
        combos=combos(),
        paths={
            "small": SMALL,
            "baseline": BASELINE,
            "grown": GROWN,
            "refined": REFINED,
            "ensemble": ENSEMBLE if config["controls"]["ensemble"] else None,
        },
        branches=BRANCHES,  # the cooldown branches' points of M_0 and of the refinements (growlm.envelope)
        vocab_size=config["tokenizer"]["vocab_size"],
        levels=ARM_LEVELS,
    script:
        "../scripts/compare.py"
