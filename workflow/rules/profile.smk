# Profiling: short training runs of a small member, M_0 and M'_1 (during refinement) under Nsight
# Systems or Nsight Compute (the {tool} wildcard), each falling back to torch.profiler where the
# tool or a GPU is missing, turned into tidy tables that name the profiler that made them. Raw
# reports stay in the folder.


rule profile:
    input:
        unpack(profile_inputs),
    output:
        phases=res("profile/{tool}/{kind}/phases.csv"),
        kernels=res("profile/{tool}/{kind}/kernels.csv"),
        summary=res("profile/{tool}/{kind}/summary.csv"),
    log:
        res("logs/profile/{tool}_{kind}.log"),
    benchmark:
        res("benchmarks/profile/{tool}_{kind}.tsv")
    conda:
        "../envs/growlm.yaml"
    threads: config["train"]["threads"]
    resources:
        gpu=launch.one_process_gpus(config["resources"]),  # the profiled workload is one process
        runtime=30,
    params:
        profile=profile_params,
    script:
        "../scripts/profile_model.py"


rule profile_report:
    input:
        tables=profile_targets(),
        curves=res("eval/curves.csv"),
    output:
        report(
            res("report/profile.html"),
            caption="../report/profile.rst",
            category="4. Profile",
        ),
    log:
        res("logs/profile_report.log"),
    benchmark:
        res("benchmarks/profile_report.tsv")
    conda:
        "../envs/growlm.yaml"
    script:
        "../scripts/profile_report.py"
