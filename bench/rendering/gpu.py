"""Sections 3 and 4 of bench/RESULTS.md, the GPU: MFU eager and compiled on one H100 and the memory planner's
first run (3), and `bench/gpu_check`'s run (4: its environment, MFU beside the reference loop, the
refinement's speed, the memory planner, the workflow part)."""

from __future__ import annotations

import pandas as pd

from rendering.core import RESULTS_PAGE, block, missing, pct, row_of, sentence, table


@block("gpu-mfu-eager", RESULTS_PAGE, "gpu_mfu_h100.csv", "gpu_mfu_h100_compile.csv", "gpu_mfu_h100_headdim16.csv")
def gpu_mfu_eager(eager, compiled, hd16) -> str:
    rows = []
    for _, r in eager.iterrows():
        c = compiled[compiled["d"] == r["d"]]
        rows.append([int(r["d"]), f"{r['params'] / 1e6:.1f}M", f"{r['tokens_per_s']:,.0f}", f"{r['step_ms']:.1f}",
                     pct(r["mfu"]), pct(c["mfu"].iloc[0]) if len(c) else "-", pct(r["gemm_ceiling"], 0)])
    return table(["d", "parameters", "tokens/s (eager)", "step ms", "MFU eager", "MFU compiled",
                  "matmul ceiling (same GEMMs)"], rows) + "\n\n" + sentence("gpu_headdim16", h=hd16.iloc[0])


def _memory_sentence(df: pd.DataFrame) -> str:
    """The largest model trained naively and by the planner under the cap, and the planner's throughput."""
    return sentence("gpu_memory",
                    naive=df[(df["mode"] == "naive") & (df["fits"] == 1)].sort_values("n_params").iloc[-1],
                    planner=df[(df["mode"] == "planner") & (df["fits"] == 1)].sort_values("n_params").iloc[-1],
                    tn=row_of(df, mode="throughput-naive"), tp=row_of(df, mode="throughput-planner"),
                    cap=df["cap_gib"].iloc[0])


@block("gpu-memory-first", RESULTS_PAGE, "memory_h100.csv")
def gpu_memory_first(df) -> str:
    return _memory_sentence(df)


@block("gpu-check-env", RESULTS_PAGE, "gpu_check_h100/env.csv")
def gpu_check_env(env) -> str:
    return sentence("gpu_check_env", e=dict(zip(env["key"], env["value"])))


@block("gpu-check-mfu", RESULTS_PAGE, "gpu_check_h100/mfu_default.csv")
def gpu_check_mfu(df) -> str:
    rows = [[int(r["d"]), int(r["layers"]), f"{r['params'] / 1e6:.1f}M", f"{int(r['batch'])} x {int(r['context'])}",
             f"{r['tokens_per_s']:,.0f}", pct(r["mfu"]), f"{r['ref_tokens_per_s']:,.0f}", pct(r["ref_mfu"]),
             f"{r['ratio_to_reference']:.3f}", pct(r["gemm_ceiling"], 0), f"{r['peak_mem_gb']:.1f}"]
            for _, r in df.iterrows()]
    return table(["d", "layers", "parameters", "batch x context", "growlm tokens/s", "growlm MFU",
                  "reference tokens/s", "reference MFU", "growlm / reference", "matmul ceiling", "peak memory GB"],
                 rows)


@block("gpu-check-refine", RESULTS_PAGE, "gpu_check_h100/refine_speed.csv")
def gpu_check_refine(df) -> str:
    names = {"off": "off (eager)", "on": "on (`train.compile`, ramps eager)", "ramps": "ramps (`compile_ramps`)"}
    rows = [[names[r["compile"]], r["arm"], f"{r['during']:.2f}", f"{r['after']:.2f}",
             "-" if r["m0_compile_s"] == r["arm_compile_s"] == 0 else f"{r['m0_compile_s']:.1f} / {r['arm_compile_s']:.1f}",
             "-" if missing(r["break_even_ramp_steps"]) else f"{r['break_even_ramp_steps']:.0f}"]
            for _, r in df.iterrows()]
    m0 = df.groupby("compile")["m0_tok_s"].first()
    return table(["compile", "arm", "tokens/s during the ramp / M_0's", "after the ramp / M_0's",
                  "compile s: M_0 / arm", "ramp steps from which compiling the ramps pays"], rows) + "\n\n" + sentence(
        "gpu_check_refine", m0=[(k, m0[k]) for k in ("off", "on", "ramps")])


@block("gpu-check-memory", RESULTS_PAGE, "gpu_check_h100/memory_gpu.csv", "memory_h100.csv")
def gpu_check_memory(df, first) -> str:
    return _memory_sentence(df) + " " + sentence(
        "gpu_check_memory", top=df[(df["mode"] == "planner")]["n_params"].max(),
        first_top=first[(first["mode"] == "planner")]["n_params"].max())


@block("gpu-check-workflow", RESULTS_PAGE, "gpu_check_h100/workflow_run.csv", "gpu_check_h100/summary_workflow.csv",
       "gpu_check_h100/workflow_rule_totals.csv", "gpu_check_h100/workflow_training.csv")
def gpu_check_workflow(run, summary, totals, training) -> str:
    rows = [[f"`{t['rule']}`", int(t["jobs"]), f"{t['total_s']:.1f}", f"{t['max_s']:.1f}", int(t["recompiles"])]
            for _, t in totals.iterrows()]
    train_rows = [[t["model"], int(t["steps"]), f"{t['wall_s']:.1f}", f"{t['compile_s']:.1f}",
                   f"{t['tokens_per_s']:,.0f}", pct(t["mfu"])] for _, t in training.iterrows()]
    return "\n\n".join([
        sentence("gpu_check_workflow", r=run.iloc[0], est=row_of(summary, part="workflow")["estimate_s"]),
        table(["rule", "jobs", "seconds, all jobs", "longest job", "recompilations"], rows),
        sentence("gpu_check_workflow_training"),
        table(["model", "steps", "wall s", "of it compiling", "tokens/s", "MFU"], train_rows)])
