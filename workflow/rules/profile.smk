# Profiling: short training runs of a small member, M_0 and M'_1 (during refinement) under Nsight
# Systems or Nsight Compute (the {tool} wildcard), each falling back to torch.profiler where the
# tool or a GPU is missing, turned into tidy tables that name the profiler that made them. Raw
# reports stay in the folder.


rule profile:
    input:
        unpack(profile_inputs),
    output:
        phases="results/profile/{tool}/{kind}/phases.csv",
        kernels="results/profile/{tool}/{kind}/kernels.csv",
        summary="results/profile/{tool}/{kind}/summary.csv",
    log:
        "results/logs/profile/{tool}_{kind}.log",
    benchmark:
        "results/benchmarks/profile/{tool}_{kind}.tsv"
    conda:
        "../envs/growlm.yaml"
    threads: config["train"]["threads"]
    resources:
        gpu=config["resources"]["gpu"],
        runtime=30,
    params:
        profile=profile_params,
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
        "../envs/growlm.yaml"
    script:
        "../scripts/profile_report.py"
