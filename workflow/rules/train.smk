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


# members.pretrained: each member imported from its folder or the Hub (not trained), with its tokenizer,
# as a growlm model folder. Known by its content, not where it lies (rules/inputs.smk); what it cost is
# the comparison's business (members.cost), not the import's.
rule import_member:
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
        identity=member_identity,  # its content (a Hub member: its commit): what reruns it
        source=pretrained_where,  # where it lies (a function of the output): reruns nothing
        context=config["model"]["context"],
    script:
        "../scripts/import_member.py"


# What the tokenizer and M_0 take from member 1 (its tokenizer's files; its config), each known by its
# content in a job with no job before it, so that a change is seen in the run that reimports the member
# (rules/inputs.smk).
rule member_part:
    output:
        MEMBER_PART,
    log:
        res("logs/member_part/{part}.log"),
    wildcard_constraints:
        part="|".join(MEMBER_PARTS),
    params:
        identity=member_part,
    run:
        write_member_part(output[0], wildcards.part, params.identity, log[0])


rule train_baseline:
    input:
        train=f"{LARGE_TOKENS}/train.npy",
        val=f"{LARGE_TOKENS}/val.npy",
        tokenizer=res("tokenizer/tokenizer.json"),
        like=like_config,
    output:
        **branch_outputs(BASELINE),
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
        train=baseline_train,
        model=lambda wc: model_settings(config, n_embd=wc.d1, n_layer=wc.L1),
        memory_limit_gb=config["resources"]["memory_limit_gb"],
        branches=branches_kept,  # where it keeps states for its cooldowns (outputs): reruns nothing itself
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
        **branch_outputs(REFINED),
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
        ramps=refine_ramps_of,
        refine_with=refine_operators_of,
        memory_limit_gb=config["resources"]["memory_limit_gb"],
        branches=branches_kept,  # where it keeps states for its cooldowns (outputs): reruns nothing itself
        how=job_how,  # how it runs (GPUs, memory share, compile): reruns nothing
        live=live_settings,  # where its live curves go (train.log_to): reruns nothing
    script:
        "../scripts/refine.py"


# Under wsd, a cooldown branch of M_0 (train.branches; with baseline.extend, also at 1 and past the budget): the
# state M_0's job kept at that point of its stable phase, trained on as the complete wsd run of the shorter
# budget that decays from there; its ledger and branch.json (no model) are what the comparison's cost by envelope
# reads (growlm.envelope, growlm.branches.baseline_ends).
rule cooldown_baseline:
    input:
        state=f"{BASELINE}/branches/b{{point}}/state",
        train=f"{LARGE_TOKENS}/train.npy",
        val=f"{LARGE_TOKENS}/val.npy",
        tokenizer=res("tokenizer/tokenizer.json"),
        like=like_config,
    output:
        ledger=f"{BASELINE}/branches/b{{point}}/ledger.csv",
        record=f"{BASELINE}/branches/b{{point}}/branch.json",
    log:
        res("logs/cooldown_baseline/d{d1}_L{L1}_t{budget}_lr{lr}_s{seed}_b{point}.log"),
    benchmark:
        res("benchmarks/cooldown_baseline/d{d1}_L{L1}_t{budget}_lr{lr}_s{seed}_b{point}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: config["train"]["threads"]
    resources:
        **training_resources(),
    params:
        train=baseline_train,
        model=lambda wc: model_settings(config, n_embd=wc.d1, n_layer=wc.L1),
        branch=baseline_branch_of,  # where it leaves M_0's run and where it ends (growlm.branches)
        memory_limit_gb=config["resources"]["memory_limit_gb"],
        how=job_how,  # how it runs (GPUs, memory share, compile): reruns nothing
    script:
        "../scripts/cooldown.py"


# ... and of a refinement (train.refine.branches): the refinement planned for the branch's budget (its refiners'
# and ramps' shares of that budget), from the state the refinement kept where they agree with the refinement's,
# else from the grown model at step 0 (growlm.branches; its state input is then not read)
rule cooldown_refine:
    input:
        state=f"{REFINED}/branches/b{{point}}/state",
        grown=f"{GROWN}/growth.json",
        train=f"{LARGE_TOKENS}/train.npy",
        val=f"{LARGE_TOKENS}/val.npy",
        tokenizer=res("tokenizer/tokenizer.json"),
    output:
        ledger=f"{REFINED}/branches/b{{point}}/ledger.csv",
        record=f"{REFINED}/branches/b{{point}}/branch.json",
    log:
        res("logs/cooldown_refine/{method}_d{d0}_L{L0}_to_d{d1}_L{L1}_n{n}_t{budget}_lr{lr}_s{seed}_b{point}.log"),
    benchmark:
        res("benchmarks/cooldown_refine/{method}_d{d0}_L{L0}_to_d{d1}_L{L1}_n{n}_t{budget}_lr{lr}_s{seed}_b{point}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: config["train"]["threads"]
    resources:
        **training_resources(),
    params:
        train=refine_train,
        ramps=refine_ramps_of,
        refine_with=refine_operators_of,
        branch=refine_branch_of,  # the refinement planned for the branch's budget (growlm.branches)
        memory_limit_gb=config["resources"]["memory_limit_gb"],
        how=job_how,  # how it runs (GPUs, memory share, compile): reruns nothing
    script:
        "../scripts/cooldown.py"
