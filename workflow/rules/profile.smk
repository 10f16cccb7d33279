# Profiling: short training runs of a small member, M_0 and M'_1 (during refinement) under Nsight
# Systems and Nsight Compute, each falling back to torch.profiler where a tool or a GPU is missing,
# turned into tidy tables that name the profiler that made them. Raw reports stay in the folder.


rule profile_nsys:
    input:
        unpack(profile_inputs),
    output:
        phases="results/profile/nsys/{kind}/phases.csv",
        kernels="results/profile/nsys/{kind}/kernels.csv",
        summary="results/profile/nsys/{kind}/summary.csv",
    params:
        args=profile_args,
        tool="nsys",
        settings=config["profile"],
    threads: config["train"]["threads"]
    resources:
        gpu=config["resources"]["gpu"],
        runtime=30,
    log:
        "results/logs/profile_nsys/{kind}.log",
    benchmark:
        "results/benchmarks/profile_nsys/{kind}.tsv"
    conda:
        "../../envs/growlm.yaml"
    script:
        "../scripts/profile_model.py"


rule profile_ncu:
    input:
        unpack(profile_inputs),
    output:
        phases="results/profile/ncu/{kind}/phases.csv",
        kernels="results/profile/ncu/{kind}/kernels.csv",
        summary="results/profile/ncu/{kind}/summary.csv",
    params:
        args=profile_args,
        tool="ncu",
        settings=config["profile"],
    threads: config["train"]["threads"]
    resources:
        gpu=config["resources"]["gpu"],
        runtime=30,
    log:
        "results/logs/profile_ncu/{kind}.log",
    benchmark:
        "results/benchmarks/profile_ncu/{kind}.tsv"
    conda:
        "../../envs/growlm.yaml"
    script:
        "../scripts/profile_model.py"


rule profile_report:
    input:
        tables=profile_targets(),
        curves="results/eval/curves.csv",
    output:
        report(
            "results/report/profile.html",
            caption="../report/profile.rst",
            category="4. Profile",
        ),
    log:
        "results/logs/profile_report.log",
    benchmark:
        "results/benchmarks/profile_report.tsv"
    conda:
        "../../envs/growlm.yaml"
    script:
        "../scripts/profile_report.py"
