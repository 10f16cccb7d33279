"""Section 7 of bench/RESULTS.md, the scaling benchmark (`bench/scaling.py`): M_0 against msg and the
multi-member arms at widths 64, 128 and 256."""

from __future__ import annotations

from rendering.core import RESULTS_PAGE, arm, block, pm, rate, reached, table, tok


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
