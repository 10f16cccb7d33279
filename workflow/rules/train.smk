# Training: the n small members on the members' levels (one job each; level 0 by default), the
# baseline M_0 from scratch on the large arms' levels (level 1), and the refinement of the grown M'_1
# into M_1 with the same loop and budget.
# Resumable checkpoints go to results/checkpoints/..., which is not a declared output.


rule train_small:
    input:
        train=f"{MEMBER_TOKENS}/train.npy",
        val=f"{MEMBER_TOKENS}/val.npy",
        tokenizer=res("tokenizer/tokenizer.json"),
        trunk=trunk_model,
    output:
        **before_decay_output(),
        model=f"{SMALL}/model.safetensors",
        config=f"{SMALL}/config.json",
        ledger=f"{SMALL}/ledger.csv",
        plan=f"{SMALL}/plan.json",
    log:
        res("logs/train_small/d{d0}_L{L0}_s{seed}_m{member}.log"),
    benchmark:
        res("benchmarks/train_small/d{d0}_L{L0}_s{seed}_m{member}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: config["train"]["threads"]
    resources:
        **training_resources(),
    params:
        train=small_train,
        model=lambda wc: model_settings(config, n_embd=wc.d0, n_layer=wc.L0),
        init_seed=lambda wc: member_seed(wc.seed, wc.member),
        shard=lambda wc: member_shard(config, wc.member),
        init_from=branch_from,
        memory_limit_gb=config["resources"]["memory_limit_gb"],
        how=job_how,  # how it runs (GPUs, memory share, compile): reruns nothing
        live=live_settings,  # where its live curves go (train.log_to): reruns nothing
    script:
        "../scripts/train_small.py"


# With members.trunk > 0 the members first train together: one trunk on all of the members' text
# for that share of their budget, from which every member branches (its cost is counted once).
rule train_trunk:
    input:
        train=f"{MEMBER_TOKENS}/train.npy",
        val=f"{MEMBER_TOKENS}/val.npy",
        tokenizer=res("tokenizer/tokenizer.json"),
    output:
        model=f"{TRUNK}/model.safetensors",
        config=f"{TRUNK}/config.json",
        ledger=f"{TRUNK}/ledger.csv",
        plan=f"{TRUNK}/plan.json",
    log:
        res("logs/train_trunk/d{d0}_L{L0}_s{seed}.log"),
    benchmark:
        res("benchmarks/train_trunk/d{d0}_L{L0}_s{seed}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: config["train"]["threads"]
    resources:
        **training_resources(),
    params:
        train=trunk_train,
        model=lambda wc: model_settings(config, n_embd=wc.d0, n_layer=wc.L0),
        init_seed=lambda wc: member_seed(wc.seed, 0),
        memory_limit_gb=config["resources"]["memory_limit_gb"],
        how=job_how,  # how it runs (GPUs, memory share, compile): reruns nothing
        live=live_settings,  # where its live curves go (train.log_to): reruns nothing
    script:
        "../scripts/train_trunk.py"


# members.pretrained: each member imported from its folder or the Hub (not trained), with its tokenizer
# and the cost it was stated to have (members.cost), as a growlm model folder.
rule import_member:
    input:
        pretrained_files,
    output:
        model=f"{PRETRAINED}/model.safetensors",
        config=f"{PRETRAINED}/config.json",
        tokenizer=f"{PRETRAINED}/tokenizer.json",
    log:
        res("logs/import_member/m{member}.log"),
    benchmark:
        res("benchmarks/import_member/m{member}.tsv")
    conda:
        "../envs/growlm.yaml"
    params:
        member=lambda wc: canonical(PRETRAINED_MEMBERS[int(wc.member) - 1]),
        content=pretrained_content,  # the folder by content: its dates rerun nothing (rules/inputs.smk)
        cost=config["members"]["cost"],
        context=config["model"]["context"],
    script:
        "../scripts/import_member.py"


rule train_baseline:
    input:
        train=f"{LARGE_TOKENS}/train.npy",
        val=f"{LARGE_TOKENS}/val.npy",
        tokenizer=res("tokenizer/tokenizer.json"),
        like=like_config,
    output:
        model=f"{BASELINE}/model.safetensors",
        config=f"{BASELINE}/config.json",
        ledger=f"{BASELINE}/ledger.csv",
        plan=f"{BASELINE}/plan.json",
    log:
        res("logs/train_baseline/d{d1}_L{L1}_t{budget}_lr{lr}_s{seed}.log"),
    benchmark:
        res("benchmarks/train_baseline/d{d1}_L{L1}_t{budget}_lr{lr}_s{seed}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: config["train"]["threads"]
    resources:
        **training_resources(),
    params:
        # with members.pretrained, M_0 is built like member 1: rerun when its config changes, not its weights
        **({"like_digest": lambda wc: member_part_digest("config.json")} if PRETRAINED_MEMBERS else {}),
        train=baseline_train,
        model=lambda wc: model_settings(config, n_embd=wc.d1, n_layer=wc.L1),
        memory_limit_gb=config["resources"]["memory_limit_gb"],
        how=job_how,  # how it runs (GPUs, memory share, compile): reruns nothing
        live=live_settings,  # where its live curves go (train.log_to): reruns nothing
    script:
        "../scripts/train_baseline.py"


rule refine:
    input:
        grown=f"{GROWN}/growth.json",
        train=f"{LARGE_TOKENS}/train.npy",
        val=f"{LARGE_TOKENS}/val.npy",
        tokenizer=res("tokenizer/tokenizer.json"),
    output:
        model=f"{REFINED}/model.safetensors",
        config=f"{REFINED}/config.json",
        ledger=f"{REFINED}/ledger.csv",
        plan=f"{REFINED}/plan.json",
    log:
        res("logs/refine/{method}_d{d0}_L{L0}_to_d{d1}_L{L1}_n{n}_t{budget}_lr{lr}_s{seed}.log"),
    benchmark:
        res("benchmarks/refine/{method}_d{d0}_L{L0}_to_d{d1}_L{L1}_n{n}_t{budget}_lr{lr}_s{seed}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: config["train"]["threads"]
    resources:
        **training_resources(),
    params:
        train=refine_train,
        ramps=lambda wc: refine_ramps(config, wc.method, budgets=SWEEP["budgets"]),
        refine_with=lambda wc: refine_operators(config, wc.method, budgets=SWEEP["budgets"]),
        memory_limit_gb=config["resources"]["memory_limit_gb"],
        how=job_how,  # how it runs (GPUs, memory share, compile): reruns nothing
        live=live_settings,  # where its live curves go (train.log_to): reruns nothing
    script:
        "../scripts/refine.py"
