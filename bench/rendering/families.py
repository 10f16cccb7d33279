"""Section 10 of bench/RESULTS.md, the model family (`bench/families.py`): GPT-2 against Llama in the default
experiment over 3 seeds, and what one member's training costs."""

from __future__ import annotations

from rendering.core import RESULTS_PAGE, arm, block, pm, reached, row_of, sentence, table


@block("families", RESULTS_PAGE, "families_summary.csv")
def families(df) -> str:
    order = {"msg": 0, "concat": 1, "concat@m1": 2}
    df = df.assign(o=df["method"].map(order)).sort_values(["family", "o"])
    rows = [["GPT-2" if r["family"] == "gpt2" else "Llama", arm(r["method"]).replace("`concat`", "`concat` + `zero_block`"),
             reached(r), pm(r["cost_ratio"], r["cost_ratio_std"]), pm(r["small_free"], r["small_free_std"]),
             f"{r['m0_final']:.3f} / {r['m1_final']:.3f}"] for _, r in df.iterrows()]
    g = row_of(df, family="gpt2", method="msg")
    return table(["family", "method", "reached", "cost ratio, members counted", "members free",
                  "final loss M_0 / M_1"], rows) + "\n\n" + sentence(
        "families_member_share", share=g["cost_ratio"] - g["small_free"])
