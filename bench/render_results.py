"""Write every table and headline number of bench/RESULTS.md and of the README's answer from the files that hold them.

    .venv/bin/python bench/render_results.py            # rewrite the rendered blocks in place
    .venv/bin/python bench/render_results.py --check    # write nothing; exit 1, naming each block that differs from its data
    .venv/bin/python bench/render_results.py --help     # the usage; writes nothing (an unknown argument is refused)

A rendered block stands between `<!-- render: NAME ... -->` and `<!-- end render: NAME -->` in a page; the
opening line names the files it is rendered from, and `BLOCKS` below says which function renders it. The data
are the benchmarks' CSV files in `bench/results/` (what `bench/savings.py`, `bench/budgets.py`, ... wrote),
`bench/published.csv` (the figures the papers report, with where each one stands) and, for parameter counts,
the benchmarks' config files read through `growlm.shape.ModelShape`. The first line of bench/RESULTS.md (the
machine-readable `headline: ...`) is rendered too. Edit a CSV or the function that renders a block, never the
block: tests/test_results_rendered.py fails while a block differs from its render, and while a number in the
prose of RESULTS.md or the README's front matter (outside the blocks) is not one that a block gives.

A block from a new CSV: put the CSV in bench/results/, add a function here decorated
`@block("name", "bench/RESULTS.md", "your_file.csv", ...)` (it receives one DataFrame per file, in that order,
and returns the Markdown), put the two marker lines where the block goes, and run this script.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the package `rendering`
from rendering.core import (  # noqa: E402  the registry, formatting and parameter counts
    BLOCKS, Block, COMMAND, DATA, README_PAGE, REPO, RESULTS_PAGE, _merged, arm, block, count, f3, load, m0_params,
    millions, missing, pct, per_param, pm, rate, ratio_cells, reached, render_block, row_of, source_path, table,
    tok, tpp)
from rendering import readings, times  # noqa: E402,F401  (register their blocks)

REEXPORTED = (Block, DATA, source_path)  # read by tests/test_results_rendered.py through this module

# ---------------------------------------------------------------------------------------------
# the headline and the first screen
# ---------------------------------------------------------------------------------------------

# Every summary of an arm compared with M_0 trained the same way (same schedule, its best rate) at the savings
# benchmark's setting or beside it; the headline is the lowest mean among those that reached M_0 on every seed.
HEADLINE_SOURCES = ("savings_summary.csv", "savings_ramp9_summary.csv", "savings_methods_summary.csv",
                    "explore_carry.csv", "explore_cross_zero.csv", "explore_members_50k.csv", "explore_msg.csv",
                    "explore_msg_carry.csv", "explore_msg_members_50k.csv", "explore_msg_members_450k.csv",
                    "explore_msg_members_450k_800k.csv", "explore_msg_ramp40.csv", "combine_seed_summary.csv",
                    "combine_carry_rates_summary.csv", "combine_shards_summary.csv", "combine_clusters_summary.csv",
                    "combine_trunk_summary.csv", "combine_trunk_average_summary.csv", "combine_n4_summary.csv",
                    "combine_n4_merge_summary.csv", "combine_n4_transition_summary.csv", "budgets_summary.csv",
                    "recipes_summary.csv", "recipes_4x_summary.csv", "recipes_4x_common_summary.csv",
                    "explore_recipes_4x_a.csv", "explore_recipes_4x_b.csv", "explore_recipes_4x_c.csv")


HEADLINE_NOTES = {"combine_trunk_summary.csv": ", section 5: m_1 trained on a shared trunk, then on one cluster of books",
                  "combine_clusters_summary.csv": ", section 5: m_1 trained on one cluster of books",
                  "explore_msg_members_450k_800k.csv": ", section 1c: m_1 trained 450k tokens"}


def _arms(frames) -> pd.DataFrame:
    """Every arm of the headline's sources, once (the same run summarised again by a later file counts once:
    the same method, budget, seeds reached, cost ratio and final loss)."""
    rows = []
    for source, df in zip(HEADLINE_SOURCES, frames):
        for _, r in df.iterrows():
            rows.append({"source": source, "method": r["method"], "budget": int(r["budget"]),
                         "seeds": int(r["seeds"]), "reached": int(r["reached"]), "mean": r["cost_ratio_mean"],
                         "std": r["cost_ratio_std"], "free": r["cost_ratio_small_free_mean"],
                         "final": r["m1_final_val_loss"]})
    arms = pd.DataFrame(rows, columns=["source", "method", "budget", "seeds", "reached", "mean", "std", "free",
                                       "final"])
    key = [(r.method, r.budget, r.reached, f"{r.mean:.6f}", f"{r.final:.5f}") for r in arms.itertuples()]
    return arms[~pd.Series(key, index=arms.index).duplicated()]


def headline_arm(frames) -> tuple[pd.Series, int]:
    arms = _arms(frames)
    full = arms[(arms["reached"] == arms["seeds"]) & (arms["seeds"] >= 3)]
    return full.sort_values("mean").iloc[0], len(arms)


def headline_line(frames) -> str:
    best, _ = headline_arm(frames)
    return f"headline: cost_ratio={best['mean']:.3f} method={best['method']} seeds={best['seeds']}"


@block("headline", RESULTS_PAGE, *HEADLINE_SOURCES, "savings_summary.csv")
def headline_sentence(*frames) -> str:
    *arms, main = frames
    best, n = headline_arm(arms)
    msg = row_of(main, method="msg", budget=400000)
    gap = (msg["cost_ratio_mean"] - best["mean"]) / best["std"]
    return (f"**The first line of this file** (`headline: ...`, read by programs) is the lowest mean cost ratio "
            f"with the members counted over the arms that reached M_0 on every seed, of the {n} arms measured at "
            f"the savings benchmark's setting (sections 1, 5, 8 and 9): {pm(best['mean'], best['std'])} (`{best['method']}`, "
            f"{best['reached']}/{best['seeds']} seeds, {best['free']:.3f} with the member free, M_0's budget "
            f"{tok(best['budget'])} tokens; `bench/results/{best['source']}`"
            f"{HEADLINE_NOTES.get(best['source'], '')}). It is the best of many, {gap:.1f} of its standard deviations below the main benchmark's "
            f"`msg` at the same budget ({pm(msg['cost_ratio_mean'], msg['cost_ratio_std'])}, section 1a): "
            f"a hint, not a finding.")


ANSWER_SOURCES = ("savings_summary.csv", "budgets_table.csv", "budgets_long_table.csv", "schedules_table.csv",
                  "families_summary.csv", "scaling_summary.csv", "config/config.yaml", "bench/savings.yaml",
                  "bench/scaling.yaml", "config/llama.yaml")


@block("answer", RESULTS_PAGE, *ANSWER_SOURCES)
def answer(savings, budgets, long, schedules, families, scaling, default, bench, scaling_cfg, llama) -> str:
    small = m0_params(_merged(default, bench))
    big = m0_params(default)
    big_llama = m0_params(_merged(default, llama))
    sc = {d1: m0_params(_merged(default, scaling_cfg), d1=d1) for d1 in (128, 256)}
    header = ["M_0: width x layers (parameters, all / non-embedding)", "M_0's tokens (per non-embedding parameter)",
              "schedule", "arm (members counted)", "reached M_0", "cost ratio, members counted", "members free",
              "section"]
    rows = []
    where = f"64 x 4 ({millions(small[1])} / {millions(small[0])})"

    def add(setting, tokens, params, schedule, method, members, r, mean, std, free, section):
        rows.append([setting, f"{tok(tokens)} ({tpp(tokens / params[0])})", schedule,
                     f"{arm(method)} ({members})", reached(r), pm(r[mean], r[std]), f3(r[free]), section])

    for b in (100000, 200000):
        r = row_of(savings, method="msg", budget=b)
        add(where, b, small, "cosine", "msg", "m_1", r, "cost_ratio_mean", "cost_ratio_std",
            "cost_ratio_small_free_mean", "1a")
    for b in (400000, 1600000, 6400000):
        r = row_of(budgets, method="msg", budget=b)
        add(where, b, small, "cosine", "msg", "m_1", r, "cost_ratio", "cost_ratio_std", "small_free", "8")
    for m, members in (("msg", "m_1"), ("msg_members+carry", "m_1, m_2")):
        r = row_of(long, method=m)
        add(where, int(r["budget"]), small, "cosine", m, members, r, "cost_ratio", "cost_ratio_std", "small_free",
            "8a")
    for b in (400000, 6400000):
        r = row_of(schedules, method="msg", schedule="wsd", m0_schedule="wsd", budget=b)
        add(where, b, small, "wsd", "msg", "m_1", r, "cost_ratio", "cost_ratio_std", "small_free", "14")
    for d1 in (128, 256):
        r = row_of(scaling, d1=d1, method="msg")
        add(f"{d1} x 4 ({millions(sc[d1][1])} / {millions(sc[d1][0])})", int(r["budget"]), sc[d1], "cosine", "msg",
            "m_1", r, "cost_ratio_mean", "cost_ratio_std", "cost_ratio_small_free_mean", "7")
    budget = default["train"]["large"]["tokens"]
    for family, params, m, members in (("gpt2", big, "msg", "m_1"), ("gpt2", big, "concat", "m_1, m_2"),
                                       ("llama", big_llama, "msg", "m_1")):
        r = row_of(families, family=family, method=m)
        name = "GPT-2" if family == "gpt2" else "Llama"
        add(f"128 x 4, {name} ({millions(params[1])} / {millions(params[0])})", budget, params, "cosine", m,
            members, r, "cost_ratio", "cost_ratio_std", "small_free", "10")
    return table(header, rows)


@block("scale", RESULTS_PAGE, "config/config.yaml", "bench/savings.yaml", "bench/scaling.yaml", "config/llama.yaml")
def scale(default, bench, scaling_cfg, llama) -> str:
    small = m0_params(_merged(default, bench))
    big = m0_params(default)
    big_llama = m0_params(_merged(default, llama))
    sc = {d1: m0_params(_merged(default, scaling_cfg), d1=d1) for d1 in (64, 128, 256)}
    largest = max([small, big, big_llama, *sc.values()], key=lambda p: p[1])
    return (f"**Scale.** Every cost ratio here comes from models trained on 2 CPU cores: M_0 and M_1 of "
            f"{millions(small[1])} parameters (width 64, 4 layers; {millions(small[0])} without the embeddings) in "
            f"most sections, {millions(big[1])} in the default experiment (width 128; Llama "
            f"{millions(big_llama[1])}), {millions(largest[1])} at the largest (width 256, section 7), and members "
            f"of half their width. Nothing here says what growth saves at a hundred million parameters or more; "
            f"the GPU figures (sections 3 and 4) are speed and memory, not savings.")


@block("budgets-per-parameter", RESULTS_PAGE, "config/config.yaml", "bench/savings.yaml", "bench/scaling.yaml",
       "config/llama.yaml", "bench/budgets.yaml", "bench/budgets_long.yaml", "scaling_summary.csv")
def budgets_per_parameter(default, bench, scaling_cfg, llama, budgets_cfg, long_cfg, scaling) -> str:
    small = m0_params(_merged(default, bench))
    big = m0_params(default)
    big_llama = m0_params(_merged(default, llama))
    small_budgets = sorted({*bench["budgets"], *budgets_cfg["budgets"], *long_cfg["budgets"], 800000})
    rows = [["the savings benchmark (sections 1, 5, 8, 9, 14): d1 = 64, L1 = 4, vocabulary "
             f"{bench['tokenizer']['vocab_size']}", f"{count(small[0])} / {count(small[1])}",
             "; ".join(f"{tok(b)}: {per_param(b, small)}" for b in small_budgets)],
            [f"the default experiment (section 10): d1 = 128, L1 = 4, vocabulary {default['tokenizer']['vocab_size']}",
             f"{count(big[0])} / {count(big[1])} (Llama {count(big_llama[0])} / {count(big_llama[1])})",
             f"{tok(default['train']['large']['tokens'])}: {per_param(default['train']['large']['tokens'], big)}"]]
    cells = []
    for d1 in sorted(scaling["d1"].unique()):
        p = m0_params(_merged(default, scaling_cfg), d1=int(d1))
        b = int(scaling[scaling["d1"] == d1]["budget"].iloc[0])
        cells.append((f"{d1}: {count(p[0])} / {count(p[1])}", f"{d1}, {tok(b)}: {per_param(b, p)}"))
    rows.append([f"the scaling benchmark (section 7): L1 = 4, vocabulary {scaling_cfg['tokenizer']['vocab_size']}",
                 "d1 = " + "; ".join(c[0] for c in cells), "d1 = " + "; ".join(c[1] for c in cells)])
    return table(["setting of M_0", "parameters: non-embedding / all",
                  "budget in tokens: per non-embedding parameter (per parameter)"], rows)


# ---------------------------------------------------------------------------------------------
# 1. savings
# ---------------------------------------------------------------------------------------------

def _cross(r) -> str:
    return "-" if missing(r.get("crossover_share_mean")) else f"{r['crossover_share_mean']:.2f}"


@block("savings", RESULTS_PAGE, "savings_summary.csv")
def savings(df) -> str:
    order = {"msg": 0, "concat+zero_block": 1, "concat+zero_block@m1": 2}
    df = df.assign(o=df["method"].map(order)).sort_values(["o", "budget"])
    rows = [[arm(r["method"]), tok(r["budget"]), *ratio_cells(r), f"{r['wall_ratio_mean']:.2f}",
             f"{r['loss_gap_equal_flops_mean']:+.3f}", _cross(r),
             f"{r['m1_final_val_loss']:.3f} ({r['m0_final_val_loss']:.3f})"] for _, r in df.iterrows()]
    return table(["method", "M_0's budget", "reached", "cost ratio, members counted", "members free",
                  "wall-clock ratio", "loss gap at equal total FLOPs", "crossover (share of M_0's budget)",
                  "final loss M_1 (M_0)"], rows)


@block("savings-ensemble", RESULTS_PAGE, "savings_summary.csv")
def savings_ensemble(df) -> str:
    r = df.iloc[0]
    return (f"The members' logit ensemble scores {r['ensemble_test_loss']:.3f} on level-1 test text: members "
            f"trained on level 0 alone know little of level 1.")


@block("methods", RESULTS_PAGE, "savings_methods_summary.csv")
def methods(df) -> str:
    df = df.assign(o=df["cost_ratio_mean"].fillna(99)).sort_values(["o", "method"])
    rows = []
    for _, r in df.iterrows():
        name = arm(r["method"]) + (" (schedule)" if r["method"] in ("vcycle", "apollo") else "")
        gap = "-" if missing(r["loss_gap_equal_flops_mean"]) else f"{r['loss_gap_equal_flops_mean']:+.3f}"
        rows.append([name, *ratio_cells(r), f"{r['m1_final_val_loss']:.3f}", gap])
    m0 = df["m0_final_val_loss"].iloc[0]
    return table(["method", "reached", "cost ratio, members counted", "members free", "final loss M_1",
                  "loss gap at equal FLOPs"], rows) + f"\n\nM_0 ends at {m0:.3f} (best rate {rate(df['m0_lr'].iloc[0])})."


EXPLORE_ROWS = (  # (change, file, method, budget)
    ("none (1b)", "savings_methods_summary.csv", "concat+zero_block", 200000),
    ("AdamW moments carried from the members (`carry`)", "explore_carry.csv", "concat+zero_block", 200000),
    ("AdamW moments carried (`carry`)", "explore_carry.csv", "hyperclone+zero_block", 200000),
    ("zero cross-member blocks instead of random, masked in (`cross_zero`)", "explore_cross_zero.csv",
     "concat+zero_block", 200000),
    ("members trained 50k tokens instead of 150k (`members_50k`)", "explore_members_50k.csv", "concat+zero_block",
     200000),
    ("members trained 50k tokens instead of 150k (`members_50k`)", "explore_members_50k.csv",
     "hyperclone+zero_block", 200000),
    ("rates 4e-3/8e-3/1.6e-2, ramp 19 steps (`msg`)", "explore_msg.csv", "msg", 200000),
    ("... and M_0's budget 400k (`msg`)", "explore_msg.csv", "msg", 400000),
    ("AdamW moments carried (`msg_carry`), ramp 19 steps", "explore_msg_carry.csv", "msg", 200000),
)


def _rows_from(spec, frames: dict, label_cols=1):
    out = []
    for label, source, method, budget in spec:
        r = row_of(frames[source], method=method, budget=budget)
        out.append([label, arm(method), *ratio_cells(r), f"{r['m1_final_val_loss']:.3f} ({r['m0_final_val_loss']:.3f})"])
    return out


@block("explore", RESULTS_PAGE, *dict.fromkeys(s for _, s, _, _ in EXPLORE_ROWS))
def explore(*frames) -> str:
    data = dict(zip(dict.fromkeys(s for _, s, _, _ in EXPLORE_ROWS), frames))
    return table(["change (`bench/explore/*.yaml`)", "method", "reached", "cost ratio, members counted",
                  "members free", "final loss M_1 (M_0)"], _rows_from(EXPLORE_ROWS, data))


MEMBER_ROWS = (
    ("50k tokens (`msg_members_50k`)", "explore_msg_members_50k.csv", 200000),
    ("50k tokens (`msg_members_50k`)", "explore_msg_members_50k.csv", 400000),
    ("150k tokens (1a)", "savings_summary.csv", 200000),
    ("150k tokens (1a)", "savings_summary.csv", 400000),
    ("450k tokens (`msg_members_450k`)", "explore_msg_members_450k.csv", 200000),
    ("450k tokens (`msg_members_450k`)", "explore_msg_members_450k.csv", 400000),
    ("450k tokens (`msg_members_450k_800k`)", "explore_msg_members_450k_800k.csv", 800000),
)


@block("member-training", RESULTS_PAGE, *dict.fromkeys(s for _, s, _ in MEMBER_ROWS))
def member_training(*frames) -> str:
    data = dict(zip(dict.fromkeys(s for _, s, _ in MEMBER_ROWS), frames))
    rows = []
    for label, source, budget in MEMBER_ROWS:
        r = row_of(data[source], method="msg", budget=budget)
        rows.append([label, tok(budget), *ratio_cells(r),
                     f"{r['m1_final_val_loss']:.3f} ({r['m0_final_val_loss']:.3f})", rate(r["m1_lr"])])
    return table(["member's training", "M_0's budget", "reached", "cost ratio, members counted", "members free",
                  "final loss M_1 (M_0)", "M_1's best rate"], rows)


@block("ramp", RESULTS_PAGE, "savings_ramp9_summary.csv", "explore_msg.csv", "explore_msg_ramp40.csv")
def ramp(r9, r19, r40) -> str:
    def cells(df):
        return [pm(*row_of(df, method="msg", budget=b)[["cost_ratio_mean", "cost_ratio_std"]])
                if (df["budget"] == b).any() else "-" for b in (100000, 200000, 400000)]
    return table(["mask ramp", "100k", "200k", "400k", "command"], [
        ["9 steps (the default rule at budgets 100k-400k)", *cells(r9), "`bench/results/savings_ramp9_summary.csv`"],
        ["19 steps (the default rule at budgets 200k-400k; rates up to 1.6e-2)", *cells(r19),
         "`--overlay bench/explore/msg.yaml`"],
        ["40 steps (`grow.options.msg.ramp_steps: 40`)", *cells(r40),
         "`--overlay bench/explore/msg_ramp40.yaml`"]])


# ---------------------------------------------------------------------------------------------
# 3 and 4. GPU
# ---------------------------------------------------------------------------------------------

@block("gpu-mfu-eager", RESULTS_PAGE, "gpu_mfu_h100.csv", "gpu_mfu_h100_compile.csv", "gpu_mfu_h100_headdim16.csv")
def gpu_mfu_eager(eager, compiled, hd16) -> str:
    rows = []
    for _, r in eager.iterrows():
        c = compiled[compiled["d"] == r["d"]]
        rows.append([int(r["d"]), f"{r['params'] / 1e6:.1f}M", f"{r['tokens_per_s']:,.0f}", f"{r['step_ms']:.1f}",
                     pct(r["mfu"]), pct(c["mfu"].iloc[0]) if len(c) else "-", pct(r["gemm_ceiling"], 0)])
    h = hd16.iloc[0]
    return table(["d", "parameters", "tokens/s (eager)", "step ms", "MFU eager", "MFU compiled",
                  "matmul ceiling (same GEMMs)"], rows) + (
        f"\n\nWith head size 16 ({int(h['heads'])} heads) at d = {int(h['d'])}: {pct(h['mfu'])} eager.")


@block("gpu-memory-first", RESULTS_PAGE, "memory_h100.csv")
def gpu_memory_first(df) -> str:
    return _memory_sentence(df)


def _memory_sentence(df: pd.DataFrame) -> str:
    naive = df[(df["mode"] == "naive") & (df["fits"] == 1)].sort_values("n_params").iloc[-1]
    planner = df[(df["mode"] == "planner") & (df["fits"] == 1)].sort_values("n_params").iloc[-1]
    tn = row_of(df, mode="throughput-naive")
    tp = row_of(df, mode="throughput-planner")
    cap = df["cap_gib"].iloc[0]
    return (f"Under a cap of {cap:g} GiB, batch {int(naive['batch'])} x {int(naive['context'])}: the largest model "
            f"that trains naively has {naive['n_params'] / 1e6:,.1f}M parameters (d {int(naive['d'])}, "
            f"{int(naive['L'])} layers); the largest the planner trains has {planner['n_params'] / 1e6:,.1f}M "
            f"(d {int(planner['d'])}, {int(planner['L'])} layers, {planner['strategy']}, micro-batch "
            f"{int(planner['micro_batch'])}): `params_ratio={planner['n_params'] / naive['n_params']:.2f}` (goal >= 4). "
            f"At the largest naive size the planner's plan (micro-batch {int(tp['micro_batch'])}) ran at "
            f"{tp['tokens_per_s']:,.0f} tokens/s against naive's {tn['tokens_per_s']:,.0f}: "
            f"`throughput_ratio={tp['tokens_per_s'] / tn['tokens_per_s']:.3f}` (goal >= 0.70).")


@block("gpu-check-env", RESULTS_PAGE, "gpu_check_h100/env.csv")
def gpu_check_env(env) -> str:
    e = dict(zip(env["key"], env["value"]))
    return (f"Measured on one {e['device']} ({e['memory_gib']} GiB, driver {e['driver']}), torch {e['torch']} "
            f"(CUDA {e['cuda_build']}), Python {e['python']}, triton {e['triton']}, transformers "
            f"{e['transformers']}, growlm at commit {e['commit']}; the bf16 dense peak taken as "
            f"{float(e['peak_tflops']):g} TFLOP/s.")


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
                  "compile s: M_0 / arm", "ramp steps from which compiling the ramps pays"], rows) + (
        "\n\nM_0's own rate: " + ", ".join(f"{m0[k]:,.0f} tokens/s ({k})" for k in ("off", "on", "ramps")) + ".")


@block("gpu-check-memory", RESULTS_PAGE, "gpu_check_h100/memory_gpu.csv", "memory_h100.csv")
def gpu_check_memory(df, first) -> str:
    top = df[(df["mode"] == "planner")]["n_params"].max()
    first_top = first[(first["mode"] == "planner")]["n_params"].max()
    return _memory_sentence(df) + (
        f" The ladder of sizes was cut by the part's time limit (`--time-budget 30`) at "
        f"{top / 1e6:,.1f}M parameters, where the first run (section 3) went on to {first_top / 1e6:,.1f}M: so the "
        f"parameter ratio is a lower bound here, and the throughput ratio is the figure the fix was for.")


@block("gpu-check-workflow", RESULTS_PAGE, "gpu_check_h100/workflow_run.csv", "gpu_check_h100/summary_workflow.csv",
       "gpu_check_h100/workflow_rule_totals.csv", "gpu_check_h100/workflow_training.csv")
def gpu_check_workflow(run, summary, totals, training) -> str:
    r = run.iloc[0]
    est = row_of(summary, part="workflow")["estimate_s"]
    rows = [[f"`{t['rule']}`", int(t["jobs"]), f"{t['total_s']:.1f}", f"{t['max_s']:.1f}", int(t["recompiles"])]
            for _, t in totals.iterrows()]
    train_rows = [[t["model"], int(t["steps"]), f"{t['wall_s']:.1f}", f"{t['compile_s']:.1f}",
                   f"{t['tokens_per_s']:,.0f}", pct(t["mfu"])] for _, t in training.iterrows()]
    return (f"The workflow part was stopped at its limit after {r['wall_s']:.0f} s (its estimate was {est:.0f} s) "
            f"with {int(r['jobs'])} jobs done and {int(r['recompiles'])} recompilations in all; the comparison was "
            f"not reached, so it gives no cost ratio. Job time by rule:\n\n"
            + table(["rule", "jobs", "seconds, all jobs", "longest job", "recompilations"], rows)
            + "\n\nThe training jobs that ran (tokens/s and MFU of the training steps; the wall time includes the "
              "compilation; the refinements ran their ramp steps eagerly):\n\n"
            + table(["model", "steps", "wall s", "of it compiling", "tokens/s", "MFU"], train_rows))


# ---------------------------------------------------------------------------------------------
# 5. several members
# ---------------------------------------------------------------------------------------------

SEED_ARMS = (("msg", "- (m_1 alone, the reference)"),
             ("msg+teach", "1. the members teach (KL to their logit average, weight 0.5 -> 0 over 80 of 195 steps, "
                           "T = 2; their forward FLOPs counted)"),
             ("msg_members", "3. m_2 placed in msg's new capacity, masked in"),
             ("msg_members+teach", "1 + 3"),
             ("msg_members+freeze", "5. inherited weights held for 20 steps"),
             ("msg_members+carry", "5. AdamW from the members' grown moments"))


def _combine_rows(df, arms) -> list[list[str]]:
    out = []
    for method, what in arms:
        r = row_of(df, method=method)
        out.append([arm(method), what, *ratio_cells(r), f"{r['m1_final_val_loss']:.3f}", rate(r["m1_lr"])])
    return out


COMBINE_HEADER = ["arm", "mechanism", "reached", "cost ratio, members counted", "members free", "final loss M_1",
                  "M_1's best rate"]


@block("combine-seed", RESULTS_PAGE, "combine_seed_summary.csv")
def combine_seed(df) -> str:
    return table(COMBINE_HEADER, _combine_rows(df, SEED_ARMS)) + (
        f"\n\nM_0 ends at {df['m0_final_val_loss'].iloc[0]:.3f} (best rate {rate(df['m0_lr'].iloc[0])}).")


@block("combine-carry-rates", RESULTS_PAGE, "combine_carry_rates_lr_sweep.csv")
def combine_carry_rates(df) -> str:
    m1 = df[df["arm"] == "M_1"].sort_values("lr")
    return ("`msg_members` + `carry`, mean final loss at each peak rate: "
            + ", ".join(f"{rate(r['lr'])} {r['mean_final_val_loss']:.3f}" for _, r in m1.iterrows()) + ".")


@block("combine-shards", RESULTS_PAGE, "combine_shards_summary.csv")
def combine_shards(df) -> str:
    return table(COMBINE_HEADER, _combine_rows(df, (("msg", "m_1 alone, on its shard"),
                                                    ("msg_members", "3. on shards"))))


@block("combine-clusters", RESULTS_PAGE, "combine_clusters_summary.csv")
def combine_clusters(df) -> str:
    return table(COMBINE_HEADER, _combine_rows(df, (("msg", "m_1 alone, on its cluster"), ("msg+teach", "1"),
                                                    ("msg_members", "3"), ("msg_members+teach", "1 + 3"))))


@block("combine-trunk", RESULTS_PAGE, "combine_trunk_summary.csv", "combine_trunk_average_summary.csv")
def combine_trunk(df, average) -> str:
    rows = _combine_rows(df, (("msg", "m_1 = trunk + its branch"),
                              ("merge+msg", "4. the branches aligned by weight matching and averaged, then grown")))
    r = row_of(average, method="merge+msg")
    rows.append([arm("merge+msg") + ", `align: none`", "4. the branches averaged as they stand, then grown",
                 *ratio_cells(r), f"{r['m1_final_val_loss']:.3f}", rate(r["m1_lr"])])
    rows += _combine_rows(df, (("msg_members", "3. on branched members"),))
    return table(COMBINE_HEADER, rows)


@block("combine-n4", RESULTS_PAGE, "combine_n4_summary.csv", "combine_n4_merge_summary.csv",
       "combine_n4_transition_summary.csv")
def combine_n4(n4, merge, transition) -> str:
    rows = _combine_rows(n4, (("msg", "m_1 alone (width 16), the reference"), ("msg+teach", "1. four teachers"),
                              ("msg_members", "3. all four in msg's new capacity"), ("msg_members+teach", "1 + 3")))
    rows += _combine_rows(merge, (("merge+msg", "4. four members trained apart, weight-matched onto m_1, averaged"),))
    rows += _combine_rows(transition, (("msg_members+carry", "5. moments carried"),
                                       ("msg_members+freeze", "5. inherited weights held")))
    return table(COMBINE_HEADER, rows)


# ---------------------------------------------------------------------------------------------
# 7, 8: scaling and budgets
# ---------------------------------------------------------------------------------------------

@block("scaling", RESULTS_PAGE, "scaling_summary.csv")
def scaling(df) -> str:
    order = {"msg": 0, "msg_members": 1, "concat+zero_block": 2}
    df = df.assign(o=df["method"].map(order)).sort_values(["d1", "o"])
    rows = [[int(r["d1"]), tok(r["budget"]), arm(r["method"]), reached(r), pm(r["cost_ratio_mean"], r["cost_ratio_std"]),
             pm(r["cost_ratio_small_free_mean"], r["cost_ratio_small_free_std"]),
             f"{r['m0_final_val_loss']:.3f} / {r['m1_final_val_loss']:.3f}", f"{rate(r['m0_lr'])} / {rate(r['m1_lr'])}"]
            for _, r in df.iterrows()]
    return table(["d1", "M_0's tokens", "method", "reached", "cost ratio, members counted", "members free",
                  "final loss M_0 / M_1", "rates M_0 / M_1"], rows)


def _budget_rows(df) -> list[list[str]]:
    return [[arm(r["method"]), tok(r["budget"]), reached(r), pm(r["cost_ratio"], r["cost_ratio_std"]),
             pm(r["small_free"], r["small_free_std"]), f"{r['m0_final']:.3f} / {r['m0_best']:.3f}",
             f"{r['m1_final']:.3f} / {r['m1_best']:.3f}", f"{int(r['m1_best_below_m0_best'])}/{int(r['seeds'])}",
             f"{rate(r['m0_lr'])} / {rate(r['m1_lr'])}"] for _, r in df.iterrows()]


BUDGET_HEADER = ["arm", "M_0's budget", "reached", "cost ratio, members counted", "members free",
                 "M_0 final / best", "M_1 final / best", "M_1's best below M_0's best", "rates M_0 / M_1"]


@block("budgets", RESULTS_PAGE, "budgets_table.csv")
def budgets(df) -> str:
    return table(BUDGET_HEADER, _budget_rows(df))


@block("budgets-long", RESULTS_PAGE, "budgets_long_table.csv", "budgets_long_table_seeds.csv")
def budgets_long(df, seeds) -> str:
    per_seed = []
    for method, g in seeds.groupby("method", sort=False):
        cells = [f"seed {int(s['seed'])}: " + (f"{s['cost_ratio']:.3f}" if s["reached"] else
                                               f"not reached ({s['m1_final']:.3f} against {s['m0_final']:.3f})")
                 for _, s in g.iterrows()]
        per_seed.append(f"{arm(method)}: " + "; ".join(cells))
    m0_best = seeds.drop_duplicates("seed")["m0_best"]
    return (table(BUDGET_HEADER, _budget_rows(df)) + "\n\nPer seed, members counted: " + ". ".join(per_seed)
            + f". M_0's best validation loss per seed: {m0_best.min():.3f}-{m0_best.max():.3f}.")


@block("budgets-long-seed1", RESULTS_PAGE, "budgets_long_seed1.csv")
def budgets_long_seed1(df) -> str:
    r = df.iloc[0]
    return (f"Against M_0 at {rate(r['m0_lr'])} instead (seed {int(r['seed'])} only, "
            f"`bench/results/budgets_long_seed1.csv`): {arm(r['method'])} reached it at {r['cost_ratio']:.3f} "
            f"(M_0 ends at {r['m0_final']:.3f}, M_1 at {r['m1_final']:.3f}).")


# ---------------------------------------------------------------------------------------------
# 9. the authors' recipes
# ---------------------------------------------------------------------------------------------

@block("published", RESULTS_PAGE, "bench/published.csv")
def published(df) -> str:
    rows = [[", ".join(m if m.startswith("(") else f"`{m}`" for m in r["method"].split(", ")), f"{r['authors']} ({r['year']}), {r['title']}",
             f"[arXiv {r['arxiv']}](https://arxiv.org/abs/{r['arxiv']})", r["where"], r["figure"],
             r["small_model_counted"]] for _, r in df.iterrows()]
    return table(["growlm's name", "paper", "arXiv", "where the figure stands", "the reported figure (its setting)",
                  "the small model's training counted?"], rows)


RECIPE_ARMS = (("msg", "msg"), ("hyperclone+zero_block", "hyperclone+zero_block"), ("lemon", "lemon"),
               ("ligo", "ligo"), ("mango", "mango"), ("apollo", "apollo"), ("vcycle", "vcycle"))


def _short(r, members=True) -> str:
    """reached, cost ratio (free), final loss: one cell."""
    if missing(r["cost_ratio_mean"]):
        return f"{reached(r)}, -, {r['m1_final_val_loss']:.3f}"
    free = "" if not members else f" (free {r['cost_ratio_small_free_mean']:.3f})"
    return f"{reached(r)}, {pm(r['cost_ratio_mean'], r['cost_ratio_std'], one='')}{free}, {r['m1_final_val_loss']:.3f}"


@block("recipes", RESULTS_PAGE, "savings_methods_summary.csv", "recipes_summary.csv")
def recipes(common, authors) -> str:
    rows = []
    for method, _ in RECIPE_ARMS:
        c = row_of(common, method=method)
        a = row_of(authors, method=method) if (authors["method"] == method).any() else None
        rows.append([arm(method), _short(c), "the same (growlm's common recipe is msg's, with its mask ramp)"
                     if a is None else _short(a)])
    for method in ("fpi", "aki", "net2net+zero_block", "hyperclone+stack"):
        rows.append([arm(method), _short(row_of(common, method=method)), "no recipe beyond the common one"])
    m0 = authors["m0_final_val_loss"].iloc[0]
    return table(["method", "common recipe (1b): reached, cost ratio, members counted (free), final loss",
                  f"the authors' recipe (M_0 {m0:.3f}): reached, cost ratio (free), final loss"], rows)


@block("recipes-4x", RESULTS_PAGE, "recipes_4x_summary.csv", "recipes_4x_common_summary.csv")
def recipes_4x(authors, common) -> str:
    rows = []
    for method in ("msg", "hyperclone+zero_block", "lemon", "ligo", "mango", "apollo", "vcycle"):
        a = row_of(authors, method=method)
        c = row_of(common, method=method) if (common["method"] == method).any() else None
        rows.append([arm(method), _short(a), "the same" if c is None else _short(c)])
    m0 = authors["m0_final_val_loss"].iloc[0]
    return table(["method", f"the authors' recipe (M_0 {m0:.3f}): reached, cost ratio (free), final loss",
                  "growlm's common recipe"], rows)


VCYCLE_ROWS = (
    ("the authors' recipe (growlm's default: stage 1 for 5 % of M_0's steps, stride pairing, coarse model half the "
     "steps at 4x the rate, alpha 0.5, final stage half the steps, no re-warm-up)", "recipes_summary.csv"),
    ("re-warm-up in the final stage (`final_warmup: 0.1`)", "explore_vcycle_final_warmup.csv"),
    ("coarse model at the large model's rate (`lr_multiplier: 1`)", "explore_vcycle_lr_mult1.csv"),
    ("no interpolation with the stage-1 weights (`alpha: 1.0`)", "explore_vcycle_alpha1.csv"),
    ("neighbouring layers and heads merged (`pairing: adjacent`)", "explore_vcycle_adjacent.csv"),
    ("final stage three quarters of the steps (`final_share: 0.75`)", "explore_vcycle_final_long.csv"),
    ("no stage 1: M_0's random initialisation coalesced (`stage_share: 0`)", "explore_vcycle_no_stage1.csv"),
    ("coarse model a quarter of the steps, not half (`coarse_share: 0.25`)", "explore_vcycle_coarse_short.csv"),
    ("the authors' code's embedding scaling (`embeddings: sum`)", "explore_vcycle_embeddings_sum.csv"),
    ("growlm's earlier variant (random initialisation coalesced, fixed tokens; section 1b)",
     "savings_methods_summary.csv"),
)


def _one_change(spec, method, frames) -> str:
    rows = []
    for (label, _), df in zip(spec, frames):
        r = row_of(df, method=method)
        rows.append([label, reached(r), f"{r['m1_final_val_loss']:.3f}"])
    return table(["change", "reached", "final loss (mean of 3 seeds)"], rows)


@block("vcycle", RESULTS_PAGE, *(s for _, s in VCYCLE_ROWS))
def vcycle(*frames) -> str:
    return _one_change(VCYCLE_ROWS, "vcycle", frames)


APOLLO_ROWS = (
    ("the authors' recipe (growlm's default: a quarter of the budget with shared layers and sampled depth in the "
     "authors' stages, 2.5 % of M_0's steps of warm-up, then the full model for the other three quarters at the "
     "peak rate, no re-warm-up)", "explore_apollo_authors.csv"),
    ("every stage up to full depth, equal lengths (`stages: equal`)", "explore_apollo_stages_equal.csv"),
    ("10 warm-up steps in the progressive stage (`warmup_steps: 10`)", "explore_apollo_warmup10.csv"),
    ("the full model trains for the whole budget after the progressive stage (`final_share: 1.0`)",
     "explore_apollo_final_full.csv"),
    ("the full model warms up again over 5 % of its stage (`final_warmup: 0.05`)", "explore_apollo_final_warmup.csv"),
    ("growlm's first variant (all four; section 1b)", "savings_methods_summary.csv"),
)


@block("apollo", RESULTS_PAGE, *(s for _, s in APOLLO_ROWS))
def apollo(*frames) -> str:
    return _one_change(APOLLO_ROWS, "apollo", frames)


LIMIT_ROWS = (  # (label, file, method)
    ("`hyperclone` + `zero_block`, common recipe (plain copies)", "explore_recipes_4x_a.csv", "hyperclone+zero_block"),
    ("... with the member's AdamW moments carried (`carry`)", "explore_recipes_4x_a.csv",
     "hyperclone+zero_block+carry"),
    ("`lemon`, common recipe", "explore_recipes_4x_a.csv", "lemon"),
    ("... with `carry`, as growlm carried moments before this run", "explore_recipes_4x_a_unbounded.csv",
     "lemon+carry"),
    ("... with `carry`, the second moment bounded (growlm now)", "explore_recipes_4x_a.csv", "lemon+carry"),
    ("`fpi` (bert2BERT), common recipe", "explore_recipes_4x_c.csv", "fpi"),
    ("`aki` (bert2BERT), common recipe", "explore_recipes_4x_c.csv", "aki"),
    ("`net2net` + `zero_block`, common recipe", "explore_recipes_4x_c.csv", "net2net+zero_block"),
    ("`hyperclone` + `stack` (G_stack's arm), common recipe", "explore_recipes_4x_c.csv", "hyperclone+stack"),
    ("`vcycle`, the authors' recipe (9)", "recipes_4x_summary.csv", "vcycle"),
    ("... no stage 1 (`stage_share: 0`)", "explore_recipes_4x_a.csv", "vcycle"),
    ("... final stage three quarters of the budget (`final_share: 0.75`)", "explore_recipes_4x_b.csv", "vcycle"),
    ("growlm's earlier V-cycle (9, common recipe)", "recipes_4x_common_summary.csv", "vcycle"),
    ("`apollo`, the authors' recipe (9)", "recipes_4x_summary.csv", "apollo"),
    ("... the full model for the whole budget (`final_share: 1.0`)", "explore_recipes_4x_a.csv", "apollo"),
    ("... the full model re-warmed up over 5 % of its stage (`final_warmup: 0.05`)", "explore_recipes_4x_b.csv",
     "apollo"),
    ("growlm's first Apollo (9, common recipe)", "recipes_4x_common_summary.csv", "apollo"),
)


@block("recipes-4x-limits", RESULTS_PAGE, *dict.fromkeys(s for _, s, _ in LIMIT_ROWS))
def recipes_4x_limits(*frames) -> str:
    data = dict(zip(dict.fromkeys(s for _, s, _ in LIMIT_ROWS), frames))
    rows = []
    for label, source, method in LIMIT_ROWS:
        r = row_of(data[source], method=method)
        cross = "-" if missing(r["crossover_share_mean"]) else f"{r['crossover_share_mean']:.2f}"
        rows.append([label, reached(r), pm(r["cost_ratio_mean"], r["cost_ratio_std"]),
                     f3(r["cost_ratio_small_free_mean"]), cross, f"{r['m1_final_val_loss']:.3f}"])
    return table(["arm", "reached", "cost ratio, members counted", "members free",
                  "crossover (share of M_0's budget)", "final loss"], rows)


@block("recipes-4x-start", RESULTS_PAGE, "explore_recipes_4x_a_comparison.csv")
def recipes_4x_start(df) -> str:
    plain = df[df["method"] == "hyperclone+zero_block"]
    return (f"A plain copy starts at the member's loss on level 1 (validation loss after growth "
            f"{plain['m1_step0_val_loss'].min():.2f}-{plain['m1_step0_val_loss'].max():.2f} over the seeds; the "
            f"unigram model's test loss {df['unigram_test_loss'].iloc[0]:.3f}).")


# ---------------------------------------------------------------------------------------------
# 10. families, 14. schedules
# ---------------------------------------------------------------------------------------------

@block("families", RESULTS_PAGE, "families_summary.csv")
def families(df) -> str:
    order = {"msg": 0, "concat": 1, "concat@m1": 2}
    df = df.assign(o=df["method"].map(order)).sort_values(["family", "o"])
    rows = [["GPT-2" if r["family"] == "gpt2" else "Llama", arm(r["method"]).replace("`concat`", "`concat` + `zero_block`"),
             reached(r), pm(r["cost_ratio"], r["cost_ratio_std"]), pm(r["small_free"], r["small_free_std"]),
             f"{r['m0_final']:.3f} / {r['m1_final']:.3f}"] for _, r in df.iterrows()]
    g = row_of(df, family="gpt2", method="msg")
    share = g["cost_ratio"] - g["small_free"]
    return table(["family", "method", "reached", "cost ratio, members counted", "members free",
                  "final loss M_0 / M_1"], rows) + (
        f"\n\nOne member's training is {share:.3f} of M_0's FLOPs (msg's ratio counted minus free, GPT-2; the two "
        f"families' members cost the same).")


SCHEDULE_COLUMNS = (("cosine (section 8)", "cosine"), ("wsd", "wsd"), ("wsd, before decay", "wsd"),
                    ("wsd", "cosine (section 8, mean loss)"), ("wsd, before decay", "cosine (section 8, mean loss)"))


@block("schedules", RESULTS_PAGE, "schedules_table.csv")
def schedules(df) -> str:
    rows = []
    for method in ("msg", "msg_members+carry"):
        for budget in (400000, 6400000):
            cells = []
            for schedule, m0 in SCHEDULE_COLUMNS:
                r = row_of(df, method=method, budget=budget, schedule=schedule, m0_schedule=m0)
                cells.append(f"{pm(r['cost_ratio'], r['cost_ratio_std'])} ({r['small_free']:.3f}), "
                             f"{reached(r)}")
            rows.append([arm(method), tok(budget), *cells])
    return table(["arm", "M_0's budget", "cosine, against cosine M_0 (section 8)", "wsd, against wsd M_0",
                  "wsd before decay, against wsd M_0", "wsd, against cosine M_0's loss",
                  "wsd before decay, against cosine M_0's loss"], rows)


@block("schedules-losses", RESULTS_PAGE, "schedules_table.csv")
def schedules_losses(df) -> str:
    rows = []
    for budget in (400000, 6400000):
        def m1(method, schedule):
            r = df[(df["method"] == method) & (df["budget"] == budget) & (df["schedule"] == schedule)
                   & df["m1_final"].notna()].iloc[0]
            return f"{r['m1_final']:.3f}"
        m0c = row_of(df, method="msg", budget=budget, schedule="cosine (section 8)", m0_schedule="cosine")["m0_final"]
        m0w = row_of(df, method="msg", budget=budget, schedule="wsd", m0_schedule="wsd")["m0_final"]
        rows.append([tok(budget), f"{m0c:.3f}", f"{m0w:.3f}",
                     *(m1(m, s) for m in ("msg", "msg_members+carry")
                       for s in ("cosine (section 8)", "wsd", "wsd, before decay"))])
    shares = []
    for method in ("msg", "msg_members+carry"):
        a = row_of(df, method=method, budget=400000, schedule="wsd", m0_schedule="wsd")["members_share"]
        b = row_of(df, method=method, budget=400000, schedule="wsd, before decay", m0_schedule="wsd")["members_share"]
        shares.append(f"{arm(method)} {b:.3f} instead of {a:.3f}")
    return table(["M_0's budget", "M_0 cosine", "M_0 wsd", "msg cosine", "msg wsd", "msg wsd, before decay",
                  "members + carry cosine", "members + carry wsd", "members + carry wsd, before decay"], rows) + (
        "\n\nThe members' training as a share of M_0's FLOPs at 400k, annealed against before their decay: "
        + "; ".join(shares) + ".")


@block("throughput", RESULTS_PAGE, "throughput_cpu.csv")
def throughput(df) -> str:
    rows = [[int(r["d"]), count(r["params"]), f"{r['growlm_tok_s']:,.0f}", f"{r['ref_tok_s']:,.0f}",
             f"{r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})"] for _, r in df.iterrows()]
    r = df.iloc[0]
    return table(["d", "parameters", "growlm tokens/s", "reference tokens/s",
                  f"ratio: median of {int(r['rounds'])} rounds (lowest-highest)"], rows) + (
        f"\n\n`throughput_ratio={df['ratio'].min():.3f}` (the lowest over the widths; goal >= 1.0: "
        f"{'met' if df['ratio'].min() >= 1 else 'not met'}), torch {r['torch']}, {int(r['threads'])} thread, "
        f"{r['clock']} clock.")


@block("modes", RESULTS_PAGE, "modes_cpu.csv")
def modes(df) -> str:
    rows = [[int(r["run"]), r["mode"], f"{r['final_val_loss']:.9f}", f"{r['loss_rel_diff']:.1e}",
             f"{r['max_weight_rel_diff']:.1e}"] for _, r in df.iterrows()]
    repeat = df.iloc[1]
    others = df.iloc[2:]
    return table(["run", "mode", "final validation loss", "relative difference", "largest weight difference"],
                 rows) + (
        f"\n\n(torch {df['torch'].iloc[0]}, on the {df['device'].iloc[0].upper()}.) The repeat of run 1 "
        + ("is the same to the bit" if repeat["max_weight_rel_diff"] == 0 == repeat["loss_rel_diff"] else
           f"differs by up to {repeat['max_weight_rel_diff']:.1e}")
        + f"; the other modes' weights differ by up to "
        f"{others['max_weight_rel_diff'].max():.1e} of a tensor's largest value, their final losses by up to "
        f"{others['loss_rel_diff'].max():.1e} relative.")


# ---------------------------------------------------------------------------------------------
# the README's answer
# ---------------------------------------------------------------------------------------------

@block("readme-answer", README_PAGE, "budgets_table.csv", "schedules_table.csv", "families_summary.csv",
       "scaling_summary.csv", "config/config.yaml", "bench/savings.yaml", "bench/scaling.yaml")
def readme_answer(budgets, schedules, families, scaling, default, bench, scaling_cfg) -> str:
    small = m0_params(_merged(default, bench))
    largest = m0_params(_merged(default, scaling_cfg), d1=int(scaling["d1"].max()))
    msg = budgets[budgets["method"] == "msg"].sort_values("budget")
    first, last = msg.iloc[0], msg.iloc[-1]
    big, big_budget = m0_params(default), default["train"]["large"]["tokens"]
    wsd = row_of(schedules, method="msg", schedule="wsd", m0_schedule="wsd", budget=int(last["budget"]))
    gpt2 = row_of(families, family="gpt2", method="msg")
    per = small[0]
    return (f"**So far, on small models only.** On GPT-2 and Llama models of {millions(small[1])} to "
            f"{millions(largest[1])} parameters trained on 2 CPU cores (3 seeds each), growing M_0 from one small "
            f"trained model with `msg` reached M_0's final loss at {first['cost_ratio']:.2f} ± "
            f"{first['cost_ratio_std']:.2f} of M_0's FLOPs with the small model's training counted "
            f"({first['small_free']:.2f} with it free) at {first['budget'] / per:.0f} training tokens per "
            f"non-embedding parameter, rising to {last['cost_ratio']:.2f} ± {last['cost_ratio_std']:.2f} "
            f"({last['small_free']:.2f}) at {last['budget'] / per:.0f} ({gpt2['cost_ratio']:.2f} ± "
            f"{gpt2['cost_ratio_std']:.2f} in the default experiment, at {big_budget / big[0]:.1f}), and combining "
            f"several small models never beat growing from one by more than the seed spread. Under warmup-stable-decay, which trains M_0 "
            f"better, the saving at {last['budget'] / per:.0f} tokens per parameter nearly vanishes "
            f"({wsd['cost_ratio']:.2f} ± {wsd['cost_ratio_std']:.2f}), and no saving has been measured at a hundred "
            f"million parameters or more, or on a GPU.")


# ---------------------------------------------------------------------------------------------
# section 15: the cost by envelope (bench/envelope.py)
# ---------------------------------------------------------------------------------------------

def _envelope_budgets(df: pd.DataFrame) -> list[int]:
    """The budgets of envelope_table.csv, the longest first."""
    return sorted({int(b) for b in df["budget"]}, reverse=True)


def _budget_cell(r: pd.Series) -> str:
    return f"{tok(r['budget'])} ({tpp(r['tokens_per_param'])}; {r['m0_passes']:.1f} passes)"


def _best_lever(df: pd.DataFrame, budget: int) -> pd.Series:
    """The lever (an arm other than plain `msg`) with the lowest mean cost ratio by envelope (members counted)
    at a budget, among those that reached M_0's loss on every seed they ran and ran the most seeds (a mean
    over three seeds before one seed's number)."""
    rows = df[(df["budget"] == budget) & (df["reached_by_envelope"] == df["seeds"]) & (df["arm"] != "msg")]
    rows = rows.assign(_most=-rows["seeds"])
    return rows.sort_values(["_most", "envelope_ratio"]).iloc[0]


@block("envelope", RESULTS_PAGE, "envelope_table.csv")
def envelope_table(df) -> str:
    header = ["M_0's tokens (per non-embedding parameter; passes over its text)", "arm", "members' FLOPs / M_0's",
              "seeds reached (envelope)", "cost ratio by envelope, members counted", "members free",
              "within one schedule, counted", "members free", "M_0 final loss", "M_1 final loss"]
    rows = []
    for budget in _envelope_budgets(df):
        for _, r in df[df["budget"] == budget].iterrows():
            rows.append([_budget_cell(r), r["arm"], f"{r['small_flops_share']:.3f}",
                         f"{int(r['reached_by_envelope'])}/{int(r['seeds'])}",
                         pm(r["envelope_ratio"], r["envelope_ratio_std"]), f3(r["envelope_ratio_small_free"]),
                         pm(r["cost_ratio"], r["cost_ratio_std"]), f3(r["cost_ratio_small_free"]),
                         f3(r["m0_final_val_loss"]), f3(r["m1_final_val_loss"])])
    return table(header, rows)


@block("envelope-tuning", RESULTS_PAGE, "envelope_m0_tuning.csv")
def envelope_tuning(tuning) -> str:
    header = ["M_0's tokens", "weight decay", "seed", "final loss", "branch 0.2", "branch 0.35", "branch 0.5",
              "branch 0.7"]
    rows = []
    for _, r in tuning.sort_values(["budget", "weight_decay", "seed"], ascending=[False, True, True]).iterrows():
        rows.append([tok(r["budget"]), f"{r['weight_decay']:g}", int(r["seed"]), f3(r["final_val_loss"]),
                     *(f3(r[f"branch_{p}_loss"]) for p in ("20", "35", "50", "70"))])
    return table(header, rows)


@block("envelope-answer", RESULTS_PAGE, "envelope_table.csv")
def envelope_answer(df) -> str:
    parts = []
    for budget in _envelope_budgets(df):
        at = df[df["budget"] == budget]
        if len(at) < 3:  # a point of two arms (the large models over both levels' text), not the grid
            continue
        msg = at[at["arm"] == "msg"].iloc[0]
        best = _best_lever(df, budget)
        parts.append(f"at {tpp(msg['tokens_per_param'])} tokens per non-embedding parameter ({tok(budget)} tokens, "
                     f"{msg['m0_passes']:.1f} passes) `msg` costs {pm(msg['envelope_ratio'], msg['envelope_ratio_std'])} "
                     f"of M_0's FLOPs by envelope with the member counted ({int(msg['seeds'])} seed"
                     f"{'s' if int(msg['seeds']) != 1 else ''}), the best lever ({best['arm']}) "
                     f"{pm(best['envelope_ratio'], best['envelope_ratio_std'])}")
    return ("**By envelope** (section 15: the loss a budget buys read off runs whose schedule ended there, "
            "against M_0 with its weight decay tuned), " + "; ".join(parts) + ".")


@block("readme-envelope", README_PAGE, "envelope_table.csv", "config/config.yaml", "bench/envelope.yaml")
def readme_envelope(df, default, env_cfg) -> str:
    params = m0_params(_merged(default, env_cfg))
    longest = _envelope_budgets(df)[0]
    best = _best_lever(df, longest)
    msg = df[(df["budget"] == longest) & (df["arm"] == "msg")].iloc[0]
    ratio = best["envelope_ratio"]
    def says(r: float) -> str:
        return "pays" if r < 0.9 else "hardly pays" if r < 1 else "does not pay"

    verdict = says(ratio)
    others = [b for b in _envelope_budgets(df) if b != longest and (df["budget"] == b).sum() >= 3]
    shorter = max(others, key=lambda b: (df["budget"] == b).sum()) if others else None  # the full grid, not a point
    short = ""
    if shorter is not None:
        lever = _best_lever(df, shorter)
        short = (f"; at {tpp(lever['tokens_per_param'])} ({tok(shorter)} tokens) it {says(lever['envelope_ratio'])}: {lever['arm']} "
                 f"{pm(lever['envelope_ratio'], lever['envelope_ratio_std'])} ({int(lever['seeds'])} seeds)")
    return (f"**Measured as scaling studies measure it**, with the loss a budget buys read off runs whose schedule "
            f"ended there (cooldown branches under warmup-stable-decay) and M_0's weight decay tuned, growing "
            f"{verdict} at a realistic budget on this scale: at {tpp(msg['tokens_per_param'])} training tokens per "
            f"non-embedding parameter (M_0 of {millions(params[1])} parameters, {tok(longest)} tokens, "
            f"{msg['m0_passes']:.1f} passes over its text) `msg` costs "
            f"{pm(msg['envelope_ratio'], msg['envelope_ratio_std'])} of M_0's FLOPs with the small model counted, "
            f"and the best of the levers tried ({best['arm']}) {pm(best['envelope_ratio'], best['envelope_ratio_std'])}"
            f"{short} ([RESULTS 15](bench/RESULTS.md#15-cost-by-envelope-at-8-and-32-tokens-per-parameter-cpu-2-cores)).")


# ---------------------------------------------------------------------------------------------
# the pages
# ---------------------------------------------------------------------------------------------

def _pattern(name: str) -> re.Pattern:
    """A block's markers; in a YAML file they and the block are comments (`# ` after the indentation)."""
    return re.compile(rf"^(?P<prefix>[ ]*(?:# )?)<!-- render: {re.escape(name)} .*?"
                      rf"^(?P=prefix)<!-- end render: {re.escape(name)} -->$", re.M | re.S)


def _commented(prefix: str, block_text: str) -> str:
    return "\n".join(prefix + line if line else prefix.rstrip() for line in block_text.split("\n"))


def rendered(page: str, text: str, data: dict | None = None) -> str:
    """`text` (the page `page`, relative to the repository) with each of its blocks rendered anew."""
    for b in BLOCKS.values():
        if b.page != page:
            continue
        pattern = _pattern(b.name)
        if not pattern.search(text):
            raise SystemExit(f"{page} has no '<!-- render: {b.name} ... -->' ... '<!-- end render: {b.name} -->'")
        new = render_block(b, data)
        text = pattern.sub(lambda m: _commented(m.group("prefix"), new), text, count=1)
    if page == RESULTS_PAGE:
        frames = [(data or {}).get(s) if data and s in data else load(s) for s in HEADLINE_SOURCES]
        first, _, rest = text.partition("\n")
        text = headline_line(frames) + "\n" + rest
    return text


def blocks_of(text: str) -> dict[str, str]:
    """The rendered blocks of a page, by name."""
    return {m.group(1): m.group(0) for m in
            re.finditer(r"^[ ]*(?:# )?<!-- render: (\S+) .*?^[ ]*(?:# )?<!-- end render: \1 -->$", text, re.M | re.S)}


def parse_args(argv: list[str]):
    """The command line: no argument rewrites the stale blocks, `--check` only names them. argparse refuses an
    unknown argument (exit 2, before any page is read), and `--help` prints the usage and exits: neither
    writes a page, which a bare `sys.argv` test did (a typo rewrote the pages in place)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="bench/render_results.py",
        description="Render every table and headline number of bench/RESULTS.md and of the README's answer from "
                    "the CSV files in bench/results/ (and the configs and bench/published.csv they name).")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each page and block that differs from its data "
                             "(what the tests and CI run)")
    return parser.parse_args(argv)


def main(argv: list[str], root: Path = REPO) -> int:
    """Render the pages under `root` (the repository; a copy of its pages in the tests) from this clone's data."""
    args = parse_args(argv)
    stale = []
    for page in sorted({b.page for b in BLOCKS.values()}):
        path = root / page
        text = path.read_text()
        new = rendered(page, text)
        if new != text:
            old_blocks, new_blocks = blocks_of(text), blocks_of(new)
            names = [n for n in new_blocks if old_blocks.get(n) != new_blocks[n]]
            if text.partition("\n")[0] != new.partition("\n")[0]:
                names.insert(0, "the headline line")
            stale.append(f"{page} ({', '.join(names)})")
            if not args.check:
                path.write_text(new)
    if stale and args.check:
        print(f"differ from their data: {'; '.join(stale)}; run {COMMAND}")
        return 1
    print(f"{'rewrote' if stale else 'up to date'}: {'; '.join(stale) or ', '.join(sorted({b.page for b in BLOCKS.values()}))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
