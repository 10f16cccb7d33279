"""Section 1 of bench/RESULTS.md, the savings benchmark (`bench/savings.py`): the main table at three budgets
(1a), every registered method at one budget (1b), and what moves the ratio one change at a time (1c: the
explore runs, the members' training, the mask ramp)."""

from __future__ import annotations

from rendering.core import (RESULTS_PAGE, arm, block, missing, pm, rate, ratio_cells, row_of, sentence, table,
                            tok)


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
    return sentence("savings_ensemble", loss=df.iloc[0]["ensemble_test_loss"])


@block("methods", RESULTS_PAGE, "savings_methods_summary.csv")
def methods(df) -> str:
    df = df.assign(o=df["cost_ratio_mean"].fillna(99)).sort_values(["o", "method"])
    rows = []
    for _, r in df.iterrows():
        name = arm(r["method"]) + (" (schedule)" if r["method"] in ("vcycle", "apollo") else "")
        gap = "-" if missing(r["loss_gap_equal_flops_mean"]) else f"{r['loss_gap_equal_flops_mean']:+.3f}"
        rows.append([name, *ratio_cells(r), f"{r['m1_final_val_loss']:.3f}", gap])
    return table(["method", "reached", "cost ratio, members counted", "members free", "final loss M_1",
                  "loss gap at equal FLOPs"], rows) + "\n\n" + sentence(
        "m0_ends", loss=df["m0_final_val_loss"].iloc[0], lr=df["m0_lr"].iloc[0])


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


@block("explore", RESULTS_PAGE, *dict.fromkeys(s for _, s, _, _ in EXPLORE_ROWS))
def explore(*frames) -> str:
    data = dict(zip(dict.fromkeys(s for _, s, _, _ in EXPLORE_ROWS), frames))
    rows = []
    for label, source, method, budget in EXPLORE_ROWS:
        r = row_of(data[source], method=method, budget=budget)
        rows.append([label, arm(method), *ratio_cells(r),
                     f"{r['m1_final_val_loss']:.3f} ({r['m0_final_val_loss']:.3f})"])
    return table(["change (`bench/explore/*.yaml`)", "method", "reached", "cost ratio, members counted",
                  "members free", "final loss M_1 (M_0)"], rows)


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
