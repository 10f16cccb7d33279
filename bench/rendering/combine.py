"""Section 5 of bench/RESULTS.md: several members against one (`bench/combine*.yaml`): by seed, with the
moments carried at several rates, on shards, on clusters of books, on a shared trunk, and with four members."""

from __future__ import annotations

from rendering.core import RESULTS_PAGE, arm, block, rate, ratio_cells, row_of, sentence, table

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
    return table(COMBINE_HEADER, _combine_rows(df, SEED_ARMS)) + "\n\n" + sentence(
        "m0_ends", loss=df["m0_final_val_loss"].iloc[0], lr=df["m0_lr"].iloc[0])


@block("combine-carry-rates", RESULTS_PAGE, "combine_carry_rates_lr_sweep.csv")
def combine_carry_rates(df) -> str:
    return sentence("combine_carry_rates", m1=[r for _, r in df[df["arm"] == "M_1"].sort_values("lr").iterrows()])


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
