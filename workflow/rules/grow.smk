# Growth: combine the n trained members into the initial weights of M'_1 (width d1, depth L1)
# with an operator (or chain) from growlm.growth.METHODS.


rule grow:
    input:
        members=member_models,
        data="results/tokens/level1/train.npy",
        val="results/tokens/level1/val.npy",
        tokenizer="results/tokenizer/tokenizer.json",
    output:
        f"{GROWN}/growth.json",
    params:
        members=lambda wc: [] if wc.method in SCHEDULES else member_dirs(wc),
        options=configured_growth_options,
        optimizer_state=config["grow"]["optimizer_state"],
        refine_steps=shortest_refine_steps(),
        batch_size=config["train"]["large"]["batch_size"],
        context=config["model"]["context"],
    threads: 1
    resources:
        mem_mb=lambda wc, attempt: config["resources"]["mem_mb"] * attempt,
        runtime=lambda wc, attempt: 10 * attempt,
    log:
        "results/logs/grow/{method}_d{d0}_L{L0}_to_d{d1}_L{L1}_n{n}_s{seed}.log",
    benchmark:
        "results/benchmarks/grow/{method}_d{d0}_L{L0}_to_d{d1}_L{L1}_n{n}_s{seed}.tsv"
    conda:
        "../../envs/growlm.yaml"
    script:
        "../scripts/grow.py"
