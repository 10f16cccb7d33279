# Growth: combine the n trained members into the initial weights of M'_1 (width d1, depth L1)
# with an operator (or chain) described in growlm.methods; or run one of the schedules described
# there, which reuse no small model.


rule grow:
    input:
        members=member_models,
        plugins=lambda wc: [ancient(f) for f in plugin_files(config, wc.method)],  # by content: grow_params
        data=f"{LARGE_TOKENS}/train.npy",
        val=f"{LARGE_TOKENS}/val.npy",
        tokenizer=res("tokenizer/tokenizer.json"),
    output:
        f"{GROWN}/growth.json",
    log:
        res("logs/grow/{method}_d{d0}_L{L0}_to_d{d1}_L{L1}_n{n}_s{seed}.log"),
    benchmark:
        res("benchmarks/grow/{method}_d{d0}_L{L0}_to_d{d1}_L{L1}_n{n}_s{seed}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: lambda wc: config["train"]["threads"] if is_schedule(wc.method) else 1  # a schedule trains: as every training job
    resources:
        # a schedule trains models: a training job's GPUs and run time; an operator, none
        gpu=lambda wc: launch.one_process_gpus(config["resources"]) if is_schedule(wc.method) else 0,
        mem_mb=lambda wc, attempt: config["resources"]["mem_mb"] * attempt,
        runtime=lambda wc, attempt: (config["resources"]["runtime"] if is_schedule(wc.method) else 10) * attempt,
    params:
        grow=grow_params,
    script:
        "../scripts/grow.py"
