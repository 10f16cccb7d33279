"""The report's first page: the answer, a figure and a sentence per arm.

`summary_sentences` turns `comparison.csv` into plain sentences: whether growing paid, with the cost
ratio with the small models counted and free, whether M_1 reached M_0's final loss, the final losses,
the controls and the mode every model was computed in. `write_summary` puts them, under the figure of
validation loss against cumulative FLOPs (`growlm.report.figures.answer_plot`), above the workflow's
description in the reST that the Snakefile gives Snakemake as the report's first page once it exists.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from growlm.errors import GrowlmError
from growlm.modes import NOT_RECORDED, experiment_mode
from growlm.predict import BUDGET_TOLERANCE, fit_trends, nearest_budget, points_from_comparison
from growlm.trend import fmt_params
from growlm.report.tables import task_failures, task_score_columns, test_level

def _ratio(mean: float, std: float, seeds: int) -> str:
    return f"{mean:.2f}" + (f" ± {std:.2f}" if seeds > 1 and std == std else "")


VERDICTS = {"saving": "growing paid", "no measurable saving": "no measurable saving",
            "costs more": "growing cost more than training from scratch"}


def _interval(g: pd.DataFrame, name: str) -> str:
    low, high = g[f"{name}_low"].iloc[0], g[f"{name}_high"].iloc[0]
    if not (low == low and high == high):  # too few seeds or points to draw from
        return f"{g[name].iloc[0]:.2f} (no interval: too few seeds to bootstrap)"
    return f"{g[name].iloc[0]:.2f} (95% interval {low:.2f}-{high:.2f})"


def multiplier_sentence(g: pd.DataFrame, small: str) -> tuple[str, str] | None:
    """(the verdict, the sentence) of an arm's effective compute multiplier (growlm.multiplier: the FLOPs M_0's
    fitted curve of finished runs needs for M_1's final loss, over M_1's), or None where the comparison has none.
    The verdict is the interval's: a saving only where the whole 95% interval lies above 1."""
    if "multiplier_free" not in g or not g["multiplier_free"].notna().any():
        return None
    counted = g["multiplier"].notna().any()
    name = "multiplier" if counted else "multiplier_free"
    verdict = VERDICTS.get(str(g["saving"].iloc[0]), "no measurable saving")
    if not counted:  # members of unknown cost: the interval is the members-free one
        verdict += " with the members free"
    seeds = int(g["m1_seeds"].iloc[0]) if g["m1_seeds"].notna().any() else g["seed"].nunique()
    whose = ("with " + small + (" counted" if counted else " free")) if small else ""
    text = (f"effective compute multiplier {_interval(g, name)} {whose}, over {seeds} seed{'s' if seeds != 1 else ''}"
            f" (the FLOPs M_0's fitted curve of its finished runs needs to reach M_1's final loss, over M_1's FLOPs; "
            f"above 1, growing saved compute)")
    if counted and small:
        text += f", {_interval(g, 'multiplier_free')} with {'it' if small == 'the small model' else 'them'} free"
    extrapolated = str(g["extrapolated"].iloc[0]).lower() in ("true", "1")
    if extrapolated:
        text += (f"; an extrapolation: M_1's final loss lies outside M_0's finished runs, which the fit is stretched "
                 f"past by a factor of {g['extrapolation_factor'].iloc[0]:.2f} in FLOPs")
    return verdict, text


def _said(head: str, verdict: str | None, details: str) -> str:
    return f"{head}: {verdict}. {details}" if verdict else f"{head}: {details}"


def _arm_sentence(method: str, arm: str, g: pd.DataFrame) -> str:
    """An arm's sentence: its verdict - the multiplier's interval where there is one (`multiplier_sentence`),
    else the cost ratio's - then how M_1 reached M_0's final loss (by envelope and within one schedule)."""
    members = int(g["members_used"].iloc[0]) if "members_used" in g else 0
    small = {0: "", 1: "the small model"}.get(members, "the small models")
    measured = multiplier_sentence(g, small)
    if measured is None:
        return _ratio_sentence(method, arm, g)
    verdict, text = measured
    head, _, details = _ratio_sentence(method, arm, g, plain=True).partition(": ")
    return f"{head}: {verdict}: {text}. {details}"


def _ratio_sentence(method: str, arm: str, g: pd.DataFrame, plain: bool = False) -> str:
    """The sentence of the cost ratios (`plain`: without their verdict, which the multiplier's replaces)."""
    seeds = g["seed"].nunique()
    reached = int(g["reached"].sum())
    m0, m1 = g["m0_final_val_loss"].mean(), g["m1_final_val_loss"].mean()
    members = int(g["members_used"].iloc[0]) if "members_used" in g else 0
    small = {0: "", 1: "the small model"}.get(members, "the small models")
    what = {"grown from n members": f"grown from {members} members",
            "grown from m_1 (single-source operator)": "grown from m_1 alone",
            "control: m_1 only": "control: m_1 alone, fed n times",
            "schedule (no small model)": "a schedule that reuses no small model"}.get(arm, arm)
    head = f"**{method}** ({what})"
    if reached == 0:
        return (f"{head}: M_1 did not reach M_0's final validation loss within the budget; it ended at {m1:.3f} "
                f"(M_0: {m0:.3f}).")
    ok = g[g["reached"].astype(bool)]
    free = _ratio(ok["cost_ratio_small_free"].mean(), ok["cost_ratio_small_free"].std(), len(ok))
    partly = f" (in {reached} of {seeds} seeds)" if reached < seeds else ""
    if small and "members_cost" in g and (g["members_cost"] == "unknown").any():
        # pretrained members whose training cost growlm does not know (members.cost not stated)
        verdict = "growing paid with the members free" if ok["cost_ratio_small_free"].mean() < 1 else \
            "growing did not pay even with the members free"
        return _said(head, None if plain else verdict,
                     f"M_1 reached M_0's final validation loss at {free} of M_0's FLOPs with {small} "
                     f"free{partly} and ended at {m1:.3f} (M_0: {m0:.3f}); the members' own training cost is not counted: "
                     f"it is not known (state it in members.cost to count it).")
    if "envelope_ratio" in g and g["envelope_ratio_small_free"].notna().any():
        return _envelope_sentence(head, g, small, members, plain)
    counted = _ratio(ok["cost_ratio"].mean(), ok["cost_ratio"].std(), len(ok))
    ratio, ratio_free = ok["cost_ratio"].mean(), ok["cost_ratio_small_free"].mean()
    if ratio < 1:
        verdict = "growing paid"
    elif ratio_free < 1:
        verdict = f"growing paid only if {small} cost nothing" if small else "growing did not pay"
    else:
        verdict = "growing did not pay"
    whose = "the small model's" if members == 1 else "the small models'"
    cost = (f"at {counted} of M_0's FLOPs counting {whose} training ({free} with {'it' if members == 1 else 'them'}"
            f" free)" if small else f"at {counted} of M_0's FLOPs")
    return _said(head, None if plain else verdict, f"M_1 reached M_0's final validation loss {cost}{partly} and ended "
                 f"at {m1:.3f} (M_0: {m0:.3f}).")


def _envelope_sentence(head: str, g: pd.DataFrame, small: str, members: int, plain: bool = False) -> str:
    """An arm whose runs make an envelope (cooldown branches, or several budgets): the cost by envelope first
    (growlm.envelope: the loss runs that ended there reached), then the first crossing within one schedule."""
    seeds = g["seed"].nunique()
    ok = g[g["envelope_reached"].astype(str).str.lower().isin(["true", "1"])]
    m0, m1 = g["m0_final_val_loss"].mean(), g["m1_final_val_loss"].mean()
    if not len(ok):
        return (f"{head}: no run of M_1 (its cooldown branches included) reached M_0's final validation loss; M_1 "
                f"ended at {m1:.3f} (M_0: {m0:.3f}).")
    partly = f" (in {len(ok)} of {seeds} seeds)" if len(ok) < seeds else ""
    free = _ratio(ok["envelope_ratio_small_free"].mean(), ok["envelope_ratio_small_free"].std(), len(ok))
    counted_known = ok["envelope_ratio"].notna().all()
    ratio = ok["envelope_ratio"].mean() if counted_known else ok["envelope_ratio_small_free"].mean()
    verdict = "growing paid" if ratio < 1 else ("growing paid only if the members cost nothing"
                                                 if ok["envelope_ratio_small_free"].mean() < 1 else "growing did not pay")
    if small and counted_known:
        whose = "the small model's" if members == 1 else "the small models'"
        cost = (f"{_ratio(ok['envelope_ratio'].mean(), ok['envelope_ratio'].std(), len(ok))} of M_0's FLOPs counting "
                f"{whose} training ({free} with {'it' if members == 1 else 'them'} free)")
    else:
        cost = f"{free} of M_0's FLOPs" + (" with the members free (their cost is not known)" if small else "")
    within = g[g["reached"].astype(str).str.lower().isin(["true", "1"])]
    inside = (f"within one schedule, M_1's first crossing inside its own run, {within['cost_ratio'].mean():.2f}"
              if len(within) and within["cost_ratio"].notna().all() else
              "within one schedule M_1's own run " + ("reached it" if len(within) else "did not reach it"))
    return _said(head, None if plain else verdict,
                 f"By envelope (each arm's finished runs - its full runs and cooldown branches, each a run that ended "
                 f"there - joined by its fitted curve or lower hull) M_1 reached M_0's final validation loss at "
                 f"{cost}{partly}; {inside}. M_1 ended at {m1:.3f} (M_0: {m0:.3f}).")


def _passes(group: pd.DataFrame) -> str:
    """How often the large arms (and the members) read their training text."""
    if "m0_passes" not in group or group["m0_passes"].isna().all():
        return ""
    members = (f", the members {group['members_passes'].iloc[0]:.3g}" if "members_passes" in group
               and group["members_passes"].notna().any() else "")
    return f"; {group['m0_passes'].iloc[0]:.3g} passes over its training text{members}"


def _per_param(group: pd.DataFrame) -> str:
    """M_0's budget in tokens per parameter (non-embedding, and total), as published savings are stated."""
    if "tokens_per_param" not in group:
        return ""
    return (f" ({group['tokens_per_param'].iloc[0]:.3g} tokens per non-embedding parameter, "
            f"{group['tokens_per_param_total'].iloc[0]:.3g} per parameter{_passes(group)})")


def _schedule(group: pd.DataFrame) -> str:
    """The learning-rate schedules, where they are not all the cosine (the refinements' and the members', where
    they differ from M_0's); and the members' point of growth where it is not their end (members.source)."""
    if "m0_schedule" not in group:
        return ""
    columns = [c for c in ("m0_schedule", "m1_schedule", "members_schedule", "members_grown_from") if c in group]
    said = group[columns].map(lambda v: "" if pd.isna(v) else str(v))  # "": not recorded (no growlm.json)
    m0, m1 = said["m0_schedule"].iloc[0], "; ".join(s for s in dict.fromkeys(said["m1_schedule"]) if s)
    members = "; ".join(s for s in dict.fromkeys(said.get("members_schedule", [])) if s)
    differ = ([f"the refinements: {m1 or '?'}"] if m1 != m0 else []) + (
        [f"the members: {members}"] if members not in ("", m0) else [])
    text = "" if not m0 or (m0 == "cosine" and not differ) else (
        f" under the {m0} schedule" + (f" ({'; '.join(differ)})" if differ else ""))
    before = said[said["members_grown_from"].str.startswith("before decay")]
    if len(before):
        where = before["members_grown_from"].iloc[0].removeprefix("before decay (").rstrip(")")
        text += (f", the members grown where their wsd decay began ({where}; their training up to there is the "
                 f"cost counted, the annealed members are evaluated)")
    return text


def _ratios(values) -> str:
    return ", ".join(f"{v:.2f}" if v == v else "not reached" for v in values)


def budget_sentences(df: pd.DataFrame) -> list[str]:
    """With several budgets: per size and method, does the saving (1 - cost ratio, small models
    counted) grow or shrink as M_0 and M_1 train longer? Means over the seeds that reached M_0's loss;
    a change of less than 0.02 in the ratio between the smallest and largest budget is 'about the same'."""
    out = []
    for (d0, L0, d1, L1, n), group in df.groupby(["d0", "L0", "d1", "L1", "n"], sort=True):
        budgets = sorted(group["budget"].unique())
        if len(budgets) < 2:
            continue
        tokens = ", ".join(f"{int(b):,}" for b in budgets)
        out.append(f"The saving across budgets (width {d0} -> {d1}, n = {n}; M_0 and each refinement trained "
                   f"{tokens} tokens): cost ratios at each budget, small models counted (free):")
        for method, g in group.groupby("method", sort=False):
            ok = g[g["reached"]]
            counted = [ok[ok["budget"] == b]["cost_ratio"].mean() for b in budgets]
            free = [ok[ok["budget"] == b]["cost_ratio_small_free"].mean() for b in budgets]
            known = [(b, r) for b, r in zip(budgets, counted) if r == r]
            if len(known) < 2:
                trend = "M_1 reached M_0's loss at fewer than two budgets, so no trend"
            else:
                change = known[-1][1] - known[0][1]
                trend = ("the saving grows with the budget" if change < -0.02 else
                         "the saving shrinks with the budget" if change > 0.02 else
                         "the saving stays about the same across budgets")
            out.append(f"**{method}**: {trend} ({_ratios(counted)}; free: {_ratios(free)}).")
    return out


def task_sentences(df: pd.DataFrame, tasks: pd.DataFrame | None) -> list[str]:
    """Per size and budget, each task's score of M_0 and of every M_1 (means over seeds), and every
    failed task run."""
    out = []
    columns = [c for c in task_score_columns(df) if c.startswith("m0_")]
    better = {}
    if tasks is not None and len(tasks):
        for _, r in tasks.iterrows():
            better[f"{r['task']}/{r['metric']}"] = str(r["higher_is_better"])
    if columns:
        for (d1, L1, budget), group in df.groupby(["d1", "L1", "budget"], sort=True):
            parts = []
            for col in columns:
                name = col[3:]
                m1 = group.groupby("method", sort=False)[f"m1_{name}"].mean()
                direction = {"True": ", higher is better", "False": ", lower is better"}.get(better.get(name, ""), "")
                task, _, metric = name.partition("/")
                parts.append(f"{task} ({metric}{direction}): M_0 {group[col].mean():.4g}; "
                             + ", ".join(f"{m} {v:.4g}" for m, v in m1.items()))
            out.append(f"Benchmark tasks (width {d1}, {L1} layers, {int(budget):,} tokens; M_1 by method): "
                       + "; ".join(parts) + ".")
    if tasks is not None and len(tasks):
        failures = task_failures(tasks)
        if failures:
            out.append(f"The {len(failures)} failed task run(s) (their scores are missing; every other result "
                       f"stands): " + "; ".join("``" + f.replace("`", "'") + "``" for f in failures) + ".")
    return out


def _who(rows: pd.DataFrame, row, name: str, keys: list[str]) -> str:
    """`name` ("M_0", "M_1 (msg)") with the sweep values that tell its rows apart (seed, sizes, budget)."""
    varying = [k for k in keys if k in rows and rows[k].nunique() > 1]
    return name + (f" ({', '.join(f'{k} {row[k]}' for k in varying)})" if varying else "")


def mode_sentences(df: pd.DataFrame) -> list[str]:
    """How every model was computed (`m0_mode`, `m1_mode`; growlm.modes): one mode for all, said once;
    else, in bold, that the arms differ by their mode as well as by their method, and each one's mode."""
    if "m0_mode" not in df or "m1_mode" not in df:  # a comparison of a growlm older than modes
        return []
    texts = [*df["m0_mode"].astype(str), *df["m1_mode"].astype(str)]
    if set(texts) == {NOT_RECORDED}:  # every ledger of a growlm older than modes: nothing to say
        return []
    shared = experiment_mode(texts)
    if shared:
        return [f"The models were all computed in one mode: {shared}."]
    keys = ["d1", "L1", "budget", "seed"]
    parts = dict.fromkeys(f"{_who(df, r, 'M_0', keys)}: {r['m0_mode']}" for _, r in df.iterrows())
    for _, r in df.iterrows():
        # the method as a literal: reST would read "concat@m1" as an e-mail address
        who = _who(df[df["method"] == r["method"]], r, f"M_1 (``{r['method']}``)", ["d0", "L0", "n", *keys])
        parts[f"{who}: {r['m1_mode']}"] = None
    return ["**The models were not all computed in one mode**, so the arms differ in the last digits of their "
            "losses by their mode as well as by their method (torch.compile and the CPU threads change the order of "
            "floating-point sums; docs/results.md, *What a mode changes*; for like with like, run every job in one "
            "mode): " + "; ".join(parts) + "."]


def summary_sentences(comparison_csv, tasks_csv=None) -> list[str]:
    """The answer, one sentence per arm (grouped by sizes and budget), from comparison.csv; then, with
    several budgets, whether the saving grows with the budget, and the benchmark tasks' scores
    (`tasks_csv`: their failed runs too)."""
    df = pd.read_csv(comparison_csv)
    if df.empty:
        return ["No comparison was made (the sweep has no grown model)."]
    df["reached"] = df["reached"].astype(str).str.lower().isin(["true", "1"])
    out = []
    keys = ["d0", "L0", "d1", "L1", "n", "budget"]
    for (d0, L0, d1, L1, n, budget), group in df.groupby(keys, sort=True):
        seeds = group["seed"].nunique()
        over = f", mean over {seeds} seeds" if seeds > 1 else ""
        def layers(k):
            return f"{k} layer{'s' if k != 1 else ''}"

        brought = group[group["members_origin"] == "trained elsewhere"] if "members_origin" in group else group.iloc[:0]
        if len(brought):  # members.pretrained: their own shape, not the config's d0 and L0
            b = brought.iloc[0]
            cost = {"stated": f"their stated cost ({b['small_flops']:.3g} FLOPs in all) counted as theirs",
                    "unknown": "their cost not stated: ratios with the members free"}.get(b["members_cost"], "")
            start = (f"starts from {n} member{'s' if n != 1 else ''} trained elsewhere ({b['members_shape']}; "
                     f"{b['members_source']}; saved in {b['members_dtype']}, trained on in float32; {cost}; their "
                     f"training time unknown, so no wall ratio counts it){over}:")
        else:
            start = f"starts from {n} small model{'s' if n != 1 else ''} of width {d0}, {layers(L0)}{over}:"
        out.append(f"M_0 (width {d1}, {layers(L1)}) trained from scratch for {int(budget):,} tokens"
                   f"{_per_param(group)}{_schedule(group)} ends at validation loss "
                   f"{group['m0_final_val_loss'].mean():.3f}; each M_1 has the same size and budget and {start}")
        for (method, arm), g in group.groupby(["method", "arm"], sort=False):
            out.append(_arm_sentence(method, arm, g))
        if "ensemble_test_loss" in group and group["ensemble_test_loss"].notna().any():
            out.append(f"The {n} members' untrained logit-average ensemble has test loss "
                       f"{group['ensemble_test_loss'].mean():.3f} on level {test_level(group)}.")
    out += budget_sentences(df)
    out += task_sentences(df, pd.read_csv(tasks_csv) if tasks_csv else None)
    out += mode_sentences(df)
    return out


def trend_sentences(df: pd.DataFrame, predict: dict | None = None) -> list[str]:
    """With two or more sizes (d1) whose arms have multipliers: per budget, each arm's trend over sizes
    (growlm.trend: log m = a + b log N, the slope's 95% interval; a change with size stated only where that interval
    excludes 0) and, with `predict` ({params, tokens_per_param}), what it predicts there, labelled as an
    extrapolation with its interval and how far past the largest measured size it reaches."""
    try:
        points = points_from_comparison(df)
    except GrowlmError:  # a comparison without multipliers: no trend
        return []
    if points["params"].nunique() < 2:
        return []
    trends = [(k, t) for k, t in fit_trends(points) if t.ok]
    counted = {(k["method"], k["n"], k["tokens_per_param"]) for k, _ in trends if k["measure"] == "counted"}
    trends = [(k, t) for k, t in trends if k["measure"] == "counted" or
              (k["method"], k["n"], k["tokens_per_param"]) not in counted]
    if not trends:
        return []
    target = nearest_budget([k["tokens_per_param"] for k, _ in trends], predict["tokens_per_param"]) if predict else None
    out = []
    for budget in sorted({k["tokens_per_param"] for k, _ in trends}):
        parts = []
        for k, t in [(k, t) for k, t in trends if k["tokens_per_param"] == budget]:
            way = ("the saving grows with size" if t.slope_low > 0 else "the saving shrinks with size"
                   if t.slope_high < 0 else "no measurable change with size")
            free = ", members free (their cost is not known)" if k["measure"] == "free" else ", members counted"
            seeds = "/".join(map(str, t.seeds))
            check = (f"; the size means scatter {t.scatter:.2f} times what their seeds explain" if t.scatter == t.scatter
                     else "; with two sizes nothing checks that the trend is a straight line")
            text = (f"**{k['method']}** (n = {k['n']}{free}): {way}: the multiplier goes as N^{t.slope:.2f} (95% "
                    f"interval of the exponent {t.slope_low:.2f} to {t.slope_high:.2f}) over {len(t.sizes)} sizes of "
                    f"{fmt_params(min(t.sizes))} to {fmt_params(max(t.sizes))} non-embedding parameters ({seeds} seeds)"
                    f"{check}")
            if predict and budget == target:
                p = t.predict(float(predict["params"]))
                asked = float(predict["tokens_per_param"])
                other = "" if budget / BUDGET_TOLERANCE <= asked <= budget * BUDGET_TOLERANCE else (
                    f" (no size was measured at {asked:g} tokens per parameter: the trend at {budget:g})")
                text += (f". At {fmt_params(p.params)} non-embedding parameters and {asked:g} tokens per parameter"
                         f"{other} it predicts a multiplier of {p.multiplier:.2f} (95% prediction interval "
                         f"{p.low:.2f}-{p.high:.2f} for a measurement over {p.seeds} seeds; the trend itself "
                         f"{p.line_low:.2f}-{p.line_high:.2f}): {p.label}, which assumes the trend stays a straight "
                         f"line in log-log that far")
            parts.append(text + ".")
        out.append(f"The multiplier's trend over sizes at {budget:g} tokens per non-embedding parameter (log m = a + "
                   f"b log N fitted over every seed of every size, its interval from a bootstrap over seeds):")
        out += parts
    return out


TREND_CAPTION = ("The effective compute multiplier against non-embedding parameters, log-log, a panel per budget: each "
                 "seed's multiplier at the measured sizes (dots), the fitted trend log m = a + b log N (line) and its "
                 "95% band from a bootstrap over seeds, and the prediction at the configured size with its 95% "
                 "prediction interval (diamond; past the largest measured size, an extrapolation). Above the dashed "
                 "line at 1, growing saved compute.")


FIGURE_CAPTION = ("Validation loss against cumulative training FLOPs, means over the seeds: each arm's curve starts "
                  "where its members' and growth's FLOPs put it (dotted from 0), the dashed line is M_0's final loss, "
                  "and a cross marks where an arm first reaches it, at the cost ratio its legend gives.")


SAVINGS_CAPTION = ("The saving at each loss: the FLOPs M_1 needs to reach a validation loss over the FLOPs M_0 needs, "
                   "both read off their envelopes of finished runs (each arm's full runs' and cooldown branches' ends, "
                   "joined by its fitted curve or lower hull), the members counted; one line per arm and seed, a cross at M_0's "
                   "final loss. Below the dashed line at 1, growing was cheaper at that loss.")


def figure_html(svg_file, caption: str = FIGURE_CAPTION, figure_id: str = "growlm-answer") -> list[str]:
    """A first-page figure as reST lines: the SVG inside the page itself (a data URI: the report is one
    file, and its first page shows no result of its own), as wide as the page, with its caption. The data
    runs over lines of 1000 characters (docutils refuses a line over 10,000; a URL's line breaks are dropped
    when a browser reads it)."""
    data = base64.b64encode(Path(svg_file).read_bytes()).decode("ascii")
    chunks = [data[i:i + 1000] for i in range(0, len(data), 1000)] or [""]
    alt = html.escape(caption, quote=True)
    # Snakemake's report centres the first page in a window-high box that scrolls: a page taller than the window
    # would lose its top (the title, the first figure) above the scrolled area; top-aligned instead
    style = (["   <style>div.h-screen.items-center:has(#growlm-answer) { align-items: flex-start; }</style>"]
             if figure_id == "growlm-answer" else [])
    return [".. raw:: html", "", *style,
            f'   <figure id="{figure_id}" style="margin: 1em 0"><img alt="{alt}" '
            f'style="width: 100%; height: auto; margin: 0" src="data:image/svg+xml;base64,{chunks[0]}',
            *(f"   {chunk}" for chunk in chunks[1:]),
            f'   "><figcaption style="font-size: 0.85em">{html.escape(caption)}</figcaption></figure>', ""]


def write_summary(comparison_csv, description_rst, out_rst, tasks_csv=None, figure_svg=None,
                  savings_svg=None, trend_svg=None, predict: dict | None = None) -> None:
    """The report's first page (reST): the figure (`figure_svg`: `answer_plot`'s) and beside it, where the arms
    have envelopes, the saving at each loss (`savings_svg`: `savings_plot`'s), the answer; with two or more sizes,
    the multiplier's trend over sizes (`trend_svg`: `trend_plot`'s, and `trend_sentences` with the prediction at
    `predict`, the config's); then the workflow's description."""
    lines = ["growlm: does growing pay?", "=" * 25, ""]
    if figure_svg is not None:
        lines += figure_html(figure_svg)
    if savings_svg is not None and Path(savings_svg).is_file() and Path(savings_svg).stat().st_size:
        lines += figure_html(savings_svg, SAVINGS_CAPTION, "growlm-savings")
    trend = trend_sentences(pd.read_csv(comparison_csv), predict)
    if trend and trend_svg is not None and Path(trend_svg).is_file() and Path(trend_svg).stat().st_size:
        lines += figure_html(trend_svg, TREND_CAPTION, "growlm-trend")
    for sentence in [*summary_sentences(comparison_csv, tasks_csv), *trend]:
        prefix = "" if sentence.startswith(("M_0 (", "The ", "**The ")) else "* "
        lines += [prefix + sentence, ""]
    lines += ["Effective compute multiplier: M_0's finished runs (the ends of its full runs and cooldown branches, "
              "seeds pooled) fitted with L(C) = E + A C^-alpha; the FLOPs that curve needs to reach M_1's final loss, "
              "over M_1's FLOPs (its members and growth counted, or free). Above 1, growing saved compute; its 95% "
              "interval comes from a bootstrap over seeds, and a saving is stated only where the whole interval lies "
              "above 1 (otherwise: no measurable saving). Where M_1's loss lies outside M_0's finished runs the fit "
              "extrapolates, and the sentence says by how much.", "",
              "Cost ratio: (FLOPs of the small models + growth + refinement FLOPs until M_1 reaches M_0's final "
              "validation loss) / M_0's FLOPs; below 1, growing was cheaper than training from scratch. *By envelope*: "
              "read off each arm's finished runs (its full runs' and cooldown branches' ends, complete runs of "
              "shorter budgets: the loss a budget buys, as scaling studies measure it) joined by its fitted curve or "
              "lower hull; the "
              "branches' own FLOPs are the measurement's cost, charged to no arm. *Within one schedule*: M_1's first "
              "crossing inside its own run, whose rate has not decayed there (an upper bound). The table under "
              f"*Comparison* holds every number; ``{comparison_csv}`` every column.", "",
              "The experiment", "--------------", "", ""]
    Path(out_rst).write_text("\n".join(lines) + Path(description_rst).read_text())
