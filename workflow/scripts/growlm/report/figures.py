"""The report's figures (SVG): loss against FLOPs, the cost ratios, scaling and budget sweeps, and the
benchmark tasks' scores. matplotlib draws without a display (the Agg backend), as on a compute node.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from growlm.errors import GrowlmError  # noqa: E402
from growlm.predict import fit_trends, nearest_budget, points_from_comparison  # noqa: E402
from growlm.report.tables import test_level  # noqa: E402

def full_runs(curves: pd.DataFrame) -> pd.DataFrame:
    """curves.csv's full runs: the rows of cooldown branches (`run` other than "full") are runs of their own,
    whose ends the envelope and the multiplier read; a figure of the runs over FLOPs draws each full run."""
    return curves[curves["run"] == "full"] if "run" in curves else curves


def loss_vs_flops_plot(curves_csv, comparison_csv, out_svg) -> None:
    """Validation loss against cumulative training FLOPs; M_1 starts at the small models' cost."""
    fig = loss_vs_flops_figure(curves_csv, comparison_csv)
    fig.savefig(out_svg, bbox_inches="tight")
    plt.close(fig)


def loss_vs_flops_figure(curves_csv, comparison_csv):
    """The figure of `loss_vs_flops_plot`: a panel per size and budget, the legend beside it."""
    curves = full_runs(pd.read_csv(curves_csv)).dropna(subset=["val_loss"])
    comp = pd.read_csv(comparison_csv)
    large = curves[~curves["arm"].str.startswith("m_")].copy()
    large["seed"] = large["seed"].astype(str)
    large["total_tflops"] = large["total_flops"] / 1e12
    if "budget" not in large:  # curves of an older growlm
        large["budget"] = comp["budget"].iloc[0] if "budget" in comp else 0
    if "budget" not in comp:
        comp["budget"] = large["budget"].iloc[0]
    groups = large.groupby(["d0", "L0", "d1", "L1", "n", "budget"], sort=True)  # one panel per size and budget
    ncols = min(3, max(1, len(groups)))
    nrows = (len(groups) + ncols - 1) // ncols
    sns.set_theme(style="whitegrid", context="notebook")
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.5 * nrows), squeeze=False)
    for ax, ((d0, L0, d1, L1, n, budget), g) in zip(axes.flat, groups):
        g = g.drop_duplicates(subset=["arm", "seed", "step"])
        sns.lineplot(data=g, x="total_tflops", y="val_loss", hue="arm", style="seed", ax=ax, marker="o",
                     markersize=3)
        sub = comp[(comp.d0 == d0) & (comp.L0 == L0) & (comp.d1 == d1) & (comp.L1 == L1) & (comp.n == n)
                   & (comp.budget == budget)]
        if len(sub):
            ax.axhline(sub["m0_final_val_loss"].mean(), color="grey", ls="--", lw=1, label="M_0 final loss")
            ax.axvline(sub["small_flops"].mean() / 1e12, color="grey", ls=":", lw=1,
                       label="cost of the n small models")
            if "ensemble_test_loss" in sub and sub["ensemble_test_loss"].notna().any():
                ax.axhline(sub["ensemble_test_loss"].mean(), color="tab:purple", ls="-.", lw=1,
                           label="members' ensemble, untrained (test loss)")
        ax.set_xlabel("cumulative training TFLOPs (M_1 includes the small models' cost)")
        ax.set_ylabel(f"validation loss, level {test_level(comp)} (nats/token)")
        ax.set_title(f"d0={d0}, L0={L0} -> d1={d1}, L1={L1}, n={n}, budget {int(budget):,} tokens")
        # the legend beside the panel, not over the curves
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.set_size_inches(9.5 * ncols, 4.8 * nrows)
    fig.tight_layout()
    return fig


# the report's first page is 32 rem wide (Snakemake's `max-w-lg`, 512 CSS pixels): its figure is drawn at
# that width (5.3 inches at 96 pixels an inch), so that its 9-point text shows at 12 pixels, not shrunk
FIRST_PAGE_INCHES = 5.3


def _flops_unit(largest: float) -> tuple[float, str]:
    """The unit that writes `largest` FLOPs with at most four digits before the point."""
    for scale, name in ((1e18, "EFLOPs"), (1e15, "PFLOPs"), (1e12, "TFLOPs"), (1e9, "GFLOPs")):
        if largest >= scale:
            return scale, name
    return 1.0, "FLOPs"


def answer_plot(curves_csv, comparison_csv, out_svg) -> None:
    """The first page's figure (`answer_figure`) as SVG, its text as text (the page's fonts draw it)."""
    with plt.rc_context({"svg.fonttype": "none"}):
        fig = answer_figure(curves_csv, comparison_csv)
        fig.savefig(out_svg, bbox_inches="tight")
    plt.close(fig)


def answer_figure(curves_csv, comparison_csv):
    """The first page's figure: validation loss against cumulative training FLOPs, M_0 and each arm
    (means over the seeds), a panel per size and budget, one above the other. Each arm's curve starts
    where its members' and growth's FLOPs put it, drawn as a dotted run from 0 to that offset; M_0's
    final loss is the dashed line, and each arm's first crossing of it is marked, its cost ratio (the
    figure's own reading of the comparison's) in the legend below the panel. Drawn at the width of the
    report's first page (`FIRST_PAGE_INCHES`)."""
    curves = full_runs(pd.read_csv(curves_csv)).dropna(subset=["val_loss"])
    comp = pd.read_csv(comparison_csv)
    large = curves[~curves["arm"].str.startswith("m_")]
    keys = ["d0", "L0", "d1", "L1", "n", "budget"]
    panels = list(large.groupby(keys, sort=True))
    scale, unit = _flops_unit(float(large["total_flops"].max()) if len(large) else 1.0)
    sns.set_theme(style="whitegrid", context="paper")
    with plt.rc_context({"font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9, "xtick.labelsize": 8,
                         "ytick.labelsize": 8, "legend.fontsize": 8}):
        fig, axes = plt.subplots(len(panels) or 1, 1, figsize=(FIRST_PAGE_INCHES, 4.3 * max(1, len(panels))),
                                 squeeze=False)
        for ax, (values, g) in zip(axes.flat, panels):
            _answer_panel(ax, g, comp, dict(zip(keys, values)), scale, unit, titled=len(panels) > 1)
        if not panels:
            axes.flat[0].text(0.5, 0.5, "no curves (the sweep has no grown model)", ha="center",
                              transform=axes.flat[0].transAxes)
        fig.tight_layout()
    return fig


def _answer_panel(ax, g: pd.DataFrame, comp: pd.DataFrame, where: dict, scale: float, unit: str, titled: bool):
    sub = comp[(comp[list(where)] == pd.Series(where)).all(axis=1)] if len(comp) else comp
    mean = (g.groupby(["arm", "step"], sort=False)[["total_flops", "val_loss", "offset_flops"]].mean()
            .reset_index().sort_values(["arm", "step"]))
    m0 = mean[mean["arm"].str.startswith("M_0")]
    m0_final, m0_flops = float(sub["m0_final_val_loss"].mean()), float(sub["m0_flops"].mean())
    ax.plot(m0["total_flops"] / scale, m0["val_loss"], color="black", lw=1.6, label="M_0, from scratch")
    ax.axhline(m0_final, color="grey", ls="--", lw=1)
    # at the left, below the line: the curves start high there, and M_0's own curve ends on it at the right
    ax.annotate(f"M_0's final loss {m0_final:.3f}", (0.0, m0_final), xycoords=("axes fraction", "data"),
                xytext=(4, -3), textcoords="offset points", ha="left", va="top", fontsize=8, color="dimgrey")
    arms = [a for a in mean["arm"].unique() if not a.startswith("M_0")]
    colours = sns.color_palette("colorblind", max(1, len(arms)))
    for colour, arm in zip(colours, arms):
        c = mean[mean["arm"] == arm]
        method = arm.removeprefix("M_1 (").removesuffix(")")
        rows = sub[sub["method"] == method]
        offset, start = float(c["offset_flops"].iloc[0]), float(c["val_loss"].iloc[0])
        reached = rows[rows["reached"].astype(str).str.lower().isin(["true", "1"])]
        label = method
        if len(reached):  # where its curve first reaches M_0's final loss, as the comparison interpolates it
            cross = offset + float(reached["m1_flops_to_m0_loss"].mean())
            label += f": M_0's loss at {cross / m0_flops:.2f}x M_0's FLOPs"
            ax.plot([cross / scale], [m0_final], marker="X", ms=8, color=colour, mec="white", mew=0.8, zorder=5)
        else:
            label += ": never reached M_0's loss"
        ax.plot(c["total_flops"] / scale, c["val_loss"], color=colour, lw=1.4, label=label)
        if offset > 0:  # the members' (and growth's) FLOPs, spent before the curve starts
            ax.plot([0, offset / scale], [start, start], color=colour, ls=":", lw=1.2)
            ax.plot([offset / scale], [start], marker="o", ms=4, color=colour)
    ax.set_xlim(left=0)
    ax.set_xlabel(f"cumulative training {unit} (an arm's members and growth included)")
    ax.set_ylabel(f"validation loss, level {test_level(comp)}")
    if titled:
        ax.set_title(f"d0={where['d0']}, L0={where['L0']} -> d1={where['d1']}, L1={where['L1']}, n={where['n']}; "
                     f"{int(where['budget']):,} tokens")
    handles, labels = ax.get_legend_handles_labels()
    extra = [plt.Line2D([], [], color="grey", ls=":", marker="o", ms=4),
             plt.Line2D([], [], color="grey", ls="", marker="X", ms=7)]
    ax.legend(handles + extra, labels + ["members' and growth's FLOPs: where an arm starts",
                                         "where an arm reaches M_0's final loss"],
              loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)


def savings_plot(savings_csv, comparison_csv, out_svg) -> bool:
    """The first page's second figure: the saving at each loss (`savings.csv`: M_1's envelope FLOPs over M_0's
    at every loss both reach, growlm.envelope), a panel per size and budget, a line per arm and seed, a cross
    at M_0's final loss. Writes nothing and returns False where no arm has an envelope (one run per arm)."""
    savings = pd.read_csv(savings_csv)
    if savings.empty:
        Path(out_svg).write_text("")
        return False
    comp = pd.read_csv(comparison_csv)
    keys = ["d0", "L0", "d1", "L1", "n", "budget"]
    panels = list(savings.groupby(keys, sort=True))
    sns.set_theme(style="whitegrid", context="paper")
    with plt.rc_context({"svg.fonttype": "none", "font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9,
                         "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8}):
        fig, axes = plt.subplots(len(panels), 1, figsize=(FIRST_PAGE_INCHES, 3.8 * len(panels)), squeeze=False)
        for ax, (values, g) in zip(axes.flat, panels):
            where = dict(zip(keys, values))
            sub = comp[(comp[keys] == pd.Series(where)).all(axis=1)]
            methods = list(dict.fromkeys(g["method"]))
            for colour, method in zip(sns.color_palette("colorblind", len(methods)), methods):
                mine = g[g["method"] == method]
                ratios = sub[sub["method"] == method]["envelope_ratio"].dropna()
                label = method + (f": {ratios.mean():.2f} at M_0's final loss" if len(ratios) else "")
                for i, (_, line) in enumerate(mine.groupby("seed")):
                    ax.plot(line["loss"], line["ratio"], color=colour, lw=1.2, label=label if i == 0 else None)
                if len(ratios):
                    ax.plot([sub["m0_final_val_loss"].mean()], [ratios.mean()], marker="X", ms=8, color=colour,
                            mec="white", mew=0.8, zorder=5)
            ax.axhline(1.0, color="grey", ls="--", lw=1)
            ax.invert_xaxis()  # training goes from high loss to low: left to right
            ax.set_xlabel("validation loss reached (lower: further trained)")
            ax.set_ylabel("M_1's FLOPs / M_0's FLOPs")
            if len(panels) > 1:
                ax.set_title(f"d0={where['d0']}, L0={where['L0']} -> d1={where['d1']}, L1={where['L1']}, "
                             f"n={where['n']}; {int(where['budget']):,} tokens")
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
        fig.tight_layout()
        fig.savefig(out_svg, bbox_inches="tight")
    plt.close(fig)
    return True


# the columns that decide first; the rest follow (all of them are in comparison.csv)


def cost_ratio_plot(comparison_csv, out_svg) -> None:
    """Bar chart: cost ratio per method (mean over seeds, bars = spread), small models counted vs free."""
    df = pd.read_csv(comparison_csv)
    if "budget" in df and df["budget"].nunique() > 1:  # one bar per method and budget
        df["method"] = df["method"] + "\n" + (df["budget"] // 1000).astype(str) + "k tokens"
    long = df.melt(id_vars=["method", "seed", "d0", "d1", "n"], value_vars=["cost_ratio", "cost_ratio_small_free"],
                   var_name="accounting", value_name="ratio")
    long["accounting"] = long["accounting"].map({"cost_ratio": "small models counted",
                                                 "cost_ratio_small_free": "small models free"})
    long["setting"] = "d0=" + long["d0"].astype(str) + " d1=" + long["d1"].astype(str) + " n=" + long["n"].astype(str)
    reached = long.dropna(subset=["ratio"])
    sns.set_theme(style="whitegrid", context="notebook")
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * long["method"].nunique() + 3), 4.5))
    if len(reached):
        sns.barplot(data=reached, x="method", y="ratio", hue="accounting", errorbar="sd", capsize=0.1, ax=ax)
        sns.stripplot(data=reached, x="method", y="ratio", hue="accounting", dodge=True, palette="dark:black", size=3,
                      ax=ax, legend=False)
    missing = sorted(set(long["method"]) - set(reached["method"]))
    ax.axhline(1.0, color="grey", ls="--", lw=1)
    ax.set_ylabel("cost to reach M_0's final loss / M_0's cost")
    title = "Cost ratio per method (mean over seeds, bars: standard deviation; below 1: growth paid off)"
    if missing:
        title += f"\nnever reached M_0's loss: {', '.join(missing)}"
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(out_svg)
    plt.close(fig)


def scaling_plot(comparison: pd.DataFrame, out_svg) -> None:
    """The cost ratio against d1, one line per method (mean over seeds, bars: standard deviation),
    with the small models counted and free side by side: does the answer hold as the model grows?
    A (method, d1) some of whose seeds never reached M_0's loss is marked with its count."""
    df = comparison.copy()
    df["reached"] = df["reached"].astype(str).str.lower().isin(["true", "1"])
    sns.set_theme(style="whitegrid", context="notebook")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, column, what in ((axes[0], "cost_ratio", "small models counted"),
                             (axes[1], "cost_ratio_small_free", "small models free")):
        for method, g in df.groupby("method", sort=False):
            stats = g.groupby("d1").agg(mean=(column, "mean"), std=(column, "std"), reached=("reached", "sum"),
                                        seeds=("seed", "nunique")).reset_index()
            if stats["mean"].isna().all():  # no seed reached M_0's loss at any width: only the marks below
                for _, row in stats.iterrows():
                    ax.annotate(f"{method}: 0/{int(row['seeds'])} reached", (row["d1"], 1.0), fontsize=7,
                                xytext=(4, 4 + 10 * list(df["method"].unique()).index(method)),
                                textcoords="offset points")
                continue
            line = ax.errorbar(stats["d1"], stats["mean"], yerr=stats["std"].fillna(0), marker="o", capsize=4,
                               label=method)
            ax.scatter(g["d1"], g[column], s=10, color=line[0].get_color(), alpha=0.5)
            for _, row in stats[stats["reached"] < stats["seeds"]].iterrows():
                y = row["mean"] if pd.notna(row["mean"]) else 1.0
                ax.annotate(f"{method}: {int(row['reached'])}/{int(row['seeds'])} reached", (row["d1"], y), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
        ax.axhline(1.0, color="grey", ls="--", lw=1)
        widths = sorted(df["d1"].unique())
        if len(widths) > 1:
            ax.set_xscale("log", base=2)
        else:  # one width in the sweep: one point per method
            ax.set_xlim(widths[0] / 1.5, widths[0] * 1.5)
        budgets = df.groupby("d1")["budget"].agg(lambda b: "/".join(f"{v / 1e6:.3g}M" for v in sorted(set(b))))
        ax.set_xticks(widths, [f"{int(v)}\n{budgets[v]}" for v in widths])  # M_0's budget under each width
        ax.set_xlabel("width d1 (d0 = d1 / 2) and M_0's tokens")
        ax.set_title(what, fontsize=10)
    axes[0].set_ylabel("cost to reach M_0's final loss / M_0's cost")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.suptitle("Cost ratio against model width (mean over seeds, bars: standard deviation; below 1: growth paid)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out_svg)
    plt.close(fig)


def budget_plot(comparison: pd.DataFrame, out_svg) -> None:
    """The cost ratio against M_0's token budget, one line per method (and size, when the sweep has
    several), mean over seeds with their standard deviation, the small models counted and free side
    by side: does the saving grow or shrink as the large models train longer? A (method, budget) some
    of whose seeds never reached M_0's loss is marked with its count."""
    df = comparison.copy()
    df["reached"] = df["reached"].astype(str).str.lower().isin(["true", "1"])
    sizes = df.groupby(["d0", "L0", "d1", "L1", "n"]).ngroups
    df["line"] = df["method"] if sizes == 1 else (
        df["method"] + " (d" + df["d0"].astype(str) + "->d" + df["d1"].astype(str) + ", n=" + df["n"].astype(str) + ")")
    sns.set_theme(style="whitegrid", context="notebook")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    lines = list(df["line"].unique())
    for ax, column, what in ((axes[0], "cost_ratio", "small models counted"),
                             (axes[1], "cost_ratio_small_free", "small models free")):
        for label, g in df.groupby("line", sort=False):
            stats = g.groupby("budget").agg(mean=(column, "mean"), std=(column, "std"), reached=("reached", "sum"),
                                            seeds=("seed", "nunique")).reset_index()
            if stats["mean"].notna().any():
                line = ax.errorbar(stats["budget"], stats["mean"], yerr=stats["std"].fillna(0), marker="o", capsize=4,
                                   label=label)
                ax.scatter(g["budget"], g[column], s=10, color=line[0].get_color(), alpha=0.5)
            for _, row in stats[stats["reached"] < stats["seeds"]].iterrows():
                y = row["mean"] if pd.notna(row["mean"]) else 1.0
                ax.annotate(f"{label}: {int(row['reached'])}/{int(row['seeds'])} reached", (row["budget"], y),
                            fontsize=7, xytext=(4, 4 + 10 * lines.index(label)), textcoords="offset points")
        ax.axhline(1.0, color="grey", ls="--", lw=1)
        budgets = sorted(df["budget"].unique())
        if len(budgets) > 1:
            ax.set_xscale("log")
        ax.set_xticks(budgets, [f"{b / 1e6:.3g}M" for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("M_0's budget (training tokens)")
        ax.set_title(what, fontsize=10)
    axes[0].set_ylabel("cost to reach M_0's final loss / M_0's cost")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.suptitle("Cost ratio against M_0's budget, each refinement trained as many tokens (mean over seeds, bars: "
                 "standard deviation; below 1: growth paid)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_svg)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# lm-evaluation-harness tasks
# ----------------------------------------------------------------------------------------------


def tasks_plot(table: pd.DataFrame, out_svg) -> None:
    """Each task's score against the training FLOPs of every model (members, M_0, every M_1; an M_1
    at its members' and growth's cost plus its refinement's), a panel per task and metric."""
    ok = table[(table["error"].fillna("").astype(str) == "") & table["named"].astype(bool)].dropna(subset=["value"])
    panels = list(ok.groupby(["task", "metric"], sort=True))
    sns.set_theme(style="whitegrid", context="notebook")
    ncols = min(3, max(1, len(panels)))
    nrows = max(1, (len(panels) + ncols - 1) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols + 2.5, 4.0 * nrows), squeeze=False)
    for ax, ((task, metric), g) in zip(axes.flat, panels):
        g = g.assign(training_tflops=g["training_flops"] / 1e12)
        sns.scatterplot(data=g, x="training_tflops", y="value", hue="arm", style="kind", s=60, ax=ax)
        if g["training_tflops"].gt(0).all() and g["training_tflops"].nunique() > 1:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # labels at the decades only
        if "perplexity" in metric and g["value"].gt(0).all():
            ax.set_yscale("log")
        better = g["higher_is_better"].astype(str).iloc[0]
        ax.set_ylabel(f"{metric}" + {"True": " (higher is better)", "False": " (lower is better)"}.get(better, ""))
        ax.set_xlabel("training TFLOPs (M_1 includes its members and growth)")
        ax.set_title(task, fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    if not panels:
        axes.flat[0].text(0.5, 0.5, "no task scores (see the task table for failed runs)", ha="center",
                          transform=axes.flat[0].transAxes)
    for ax in list(axes.flat)[max(1, len(panels)):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(out_svg)
    plt.close(fig)


def trend_plot(comparison_csv, out_svg, predict: dict | None = None) -> bool:
    """The first page's figure of the multiplier's trend over sizes (growlm.trend): the multiplier against
    non-embedding parameters, log-log, a panel per budget (tokens per parameter), per arm its seeds' multipliers
    (members counted; free where their cost is unknown), the fitted line and its 95% band, and with `predict`
    ({params, tokens_per_param}) the prediction at its size with its interval. Writes nothing and returns False
    where no arm has two sizes with multipliers."""
    try:
        points = points_from_comparison(pd.read_csv(comparison_csv))
    except GrowlmError:  # a comparison without multipliers (a growlm older than them): no trend to draw
        points = None
    trends = [(k, t) for k, t in fit_trends(points, n_boot=500) if t.ok] if points is not None and len(points) else []
    counted = {(k["method"], k["n"], k["tokens_per_param"]) for k, _ in trends if k["measure"] == "counted"}
    shown = [(k, t) for k, t in trends if k["measure"] == "counted" or
             (k["method"], k["n"], k["tokens_per_param"]) not in counted]
    if not shown:
        Path(out_svg).write_text("")
        return False
    budgets = sorted({k["tokens_per_param"] for k, _ in shown})
    target = nearest_budget(budgets, predict["tokens_per_param"]) if predict else None
    sns.set_theme(style="whitegrid", context="paper")
    with plt.rc_context({"svg.fonttype": "none", "font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9,
                         "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8}):
        fig, axes = plt.subplots(len(budgets), 1, figsize=(FIRST_PAGE_INCHES, 3.8 * len(budgets)), squeeze=False)
        for ax, budget in zip(axes.flat, budgets):
            mine = [(k, t) for k, t in shown if k["tokens_per_param"] == budget]
            colours = sns.color_palette("colorblind", len(mine))
            for colour, (k, t) in zip(colours, mine):
                column = "multiplier" if k["measure"] == "counted" else "multiplier_free"
                pts = points[(points["method"] == k["method"]) & (points["n"] == k["n"])
                             & (points["tokens_per_param"] == budget)]
                low_n, high_n = min(t.sizes) / 1.5, max(t.sizes) * 1.5
                star = predict["params"] if predict and budget == target else None
                if star:
                    low_n, high_n = min(low_n, star / 1.5), max(high_n, star * 1.5)
                grid = np.geomspace(low_n, high_n, 60)
                band_low, band_high = t.band(grid)
                label = f"{k['method']} (n = {k['n']}{', members free' if k['measure'] == 'free' else ''}): " \
                        f"m ~ N^{t.slope:.2f}"
                ax.fill_between(grid, band_low, band_high, color=colour, alpha=0.2, lw=0)
                ax.plot(grid, t.multiplier_at(grid), color=colour, lw=1.4, label=label)
                ax.plot(pts["params"], pts[column], ls="", marker="o", ms=4, color=colour, mec="white", mew=0.5)
                if star:
                    p = t.predict(float(star))
                    ax.errorbar([p.params], [p.multiplier], yerr=[[p.multiplier - p.low], [p.high - p.multiplier]],
                                color=colour, marker="D", ms=5, capsize=3, lw=1.2)
            ax.axhline(1.0, color="grey", ls="--", lw=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))  # 1.5, not 1.5 x 10^0
            ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.set_xlabel("non-embedding parameters")
            ax.set_ylabel("effective compute multiplier")
            ax.set_title(f"{budget:g} tokens per non-embedding parameter")
            handles, labels = ax.get_legend_handles_labels()
            extra = [plt.Line2D([], [], color="grey", ls="", marker="o", ms=4)]
            names = ["a seed's multiplier at a measured size"]
            if predict and budget == target:
                extra.append(plt.Line2D([], [], color="grey", marker="D", ms=5))
                names.append(f"prediction at {predict['params']:.3g} parameters (95% interval)")
            ax.legend(handles + extra, labels + names, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1,
                      frameon=False)
        fig.tight_layout()
        fig.savefig(out_svg, bbox_inches="tight")
    plt.close(fig)
    return True
