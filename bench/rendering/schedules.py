"""Section 14 of bench/RESULTS.md, cosine against warmup-stable-decay (`bench/schedules.py`): the cost ratios
under each schedule and against each M_0, the final losses, and the members' share before their decay."""

from __future__ import annotations

from rendering.core import RESULTS_PAGE, arm, block, pm, reached, row_of, sentence, table, tok

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
        shares.append((arm(method),
                       row_of(df, method=method, budget=400000, schedule="wsd, before decay",
                              m0_schedule="wsd")["members_share"],
                       row_of(df, method=method, budget=400000, schedule="wsd", m0_schedule="wsd")["members_share"]))
    return table(["M_0's budget", "M_0 cosine", "M_0 wsd", "msg cosine", "msg wsd", "msg wsd, before decay",
                  "members + carry cosine", "members + carry wsd", "members + carry wsd, before decay"],
                 rows) + "\n\n" + sentence("schedules_members_share", shares=shares)
