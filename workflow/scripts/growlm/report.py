"""The Snakemake report: its first page (the answer, a sentence per arm), figures and tables.

`summary_sentences` turns `comparison.csv` into plain sentences: whether growing paid, with the cost
ratio with the small models counted and free, whether M_1 reached M_0's final loss, the final losses
and the controls. `write_summary` puts them above the workflow's description in the reST that the
Snakefile gives Snakemake as the report's first page once it exists.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from growlm.errors import read_json  # noqa: E402

TABLE_STYLE = """<style>
body { font-family: sans-serif; font-size: 13px; }
table { border-collapse: collapse; }
th, td { border: 1px solid #bbb; padding: 3px 8px; text-align: right; }
th { background: #eee; }
caption { caption-side: top; text-align: left; font-weight: bold; padding: 4px 0; }
</style>"""


def _html_page(title: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>{TABLE_STYLE}</head><body>{body}</body></html>"


def _test_level(comparison: pd.DataFrame) -> str:
    """The level whose splits the comparison reports (`levels.evaluate`; level 1 by default)."""
    if "test_level" in comparison and len(comparison):
        return str(comparison["test_level"].iloc[0])
    return "1"


def _data_of(record: dict) -> str:
    """Where a source's text came from, exactly: the Hub commit, or the files' sha256 (short)."""
    if record.get("hf") and not record.get("files"):
        rev = record.get("resolved_revision") or "unresolved"
        return f"{record['hf']}@{rev[:12]} ({record.get('split', 'train')})"
    files = record.get("files") or []
    shown = ", ".join(f"{Path(f['path']).name} sha256 {f['sha256'][:12]}" for f in files[:3])
    return shown + (f" and {len(files) - 3} more files" if len(files) > 3 else "")


def corpus_stats_table(stats_files: list[str], *, csv_file, html_file) -> pd.DataFrame:
    """One row per reading level (in the configured order), then one per source with its provenance."""
    rows, sources = [], []
    for f in stats_files:
        stats = read_json(f)
        per_source = stats.pop("sources")
        provenance = stats.pop("provenance", {})
        stats.pop("lines", None)
        if isinstance(per_source, dict):  # sentences kept per source
            stats["sources"] = len(per_source)
            stats["books"] = ", ".join(per_source)
            for name, kept in per_source.items():
                record = provenance.get(name, {})
                sources.append({"level": stats["level"], "source": name, "kind": record.get("kind", ""),
                                "clean": record.get("clean", ""), "documents": record.get("documents"),
                                "units kept": kept, "data": _data_of(record)})
        else:
            stats["sources"] = per_source
        rows.append(stats)
    df = pd.json_normalize(rows)
    df.columns = [c.replace("splits.", "").replace(".", " ") for c in df.columns]
    df.to_csv(csv_file, index=False)
    html = df.to_html(index=False, float_format=lambda v: f"{v:.2f}", table_id="corpus-stats")
    if sources:
        html += "<h3>Sources</h3>" + pd.DataFrame(sources).to_html(index=False, table_id="corpus-sources")
    Path(html_file).write_text(_html_page("Corpus statistics", f"<h3>Corpus statistics per reading level</h3>{html}"))
    return df


def loss_vs_flops_plot(curves_csv, comparison_csv, out_svg) -> None:
    """Validation loss against cumulative training FLOPs; M_1 starts at the small models' cost."""
    fig = loss_vs_flops_figure(curves_csv, comparison_csv)
    fig.savefig(out_svg, bbox_inches="tight")
    plt.close(fig)


def loss_vs_flops_figure(curves_csv, comparison_csv):
    """The figure of `loss_vs_flops_plot`: a panel per size and budget, the legend beside it."""
    curves = pd.read_csv(curves_csv).dropna(subset=["val_loss"])
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
        ax.set_ylabel(f"validation loss, level {_test_level(comp)} (nats/token)")
        ax.set_title(f"d0={d0}, L0={L0} -> d1={d1}, L1={L1}, n={n}, budget {int(budget):,} tokens")
        # the legend beside the panel, not over the curves
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.set_size_inches(9.5 * ncols, 4.8 * nrows)
    fig.tight_layout()
    return fig


# the columns that decide first; the rest follow (all of them are in comparison.csv)
COMPARISON_COLUMNS = {
    "method": "method", "arm": "arm", "reached": "reached M_0's loss",
    "cost_ratio": "cost ratio (small counted)", "cost_ratio_small_free": "cost ratio (small models free)",
    "m0_final_val_loss": "M_0 final val loss", "m1_final_val_loss": "M_1 final val loss",
    "loss_gap_equal_flops": "loss gap at equal total FLOPs",
    "seed": "seed", "d0": "d0", "L0": "L0", "d1": "d1", "L1": "L1", "n": "n", "members_used": "members used",
    "budget": "budget (tokens)", "m0_lr": "M_0 peak lr", "m1_lr": "M_1 peak lr",
    "m1_step0_val_loss": "M'_1 val loss at step 0",
    "m0_test_ppl": "M_0 test ppl", "m1_test_ppl": "M_1 test ppl",
    "m0_test_acc": "M_0 test acc", "m1_test_acc": "M_1 test acc",
    "unigram_test_loss": "unigram test loss",
    "ensemble_test_loss": "members' ensemble test loss (untrained)",
    "m0_flops": "M_0 FLOPs", "small_flops": "n small models' FLOPs",
    "m1_flops_to_m0_loss": "M_1 refine FLOPs to M_0's loss",
    "wall_ratio": "wall ratio (small counted)",
}


def comparison_html(comparison_csv, out_html, lr_sweep_csv=None) -> None:
    df = pd.read_csv(comparison_csv)
    cols = [c for c in COMPARISON_COLUMNS if c in df.columns] + task_score_columns(df)
    view = df[cols].astype(object)
    for col in ("m1_flops_to_m0_loss", "cost_ratio", "cost_ratio_small_free", "wall_ratio"):
        if col in view:
            view[col] = view[col].where(pd.notna(df[col]), "not reached")
    view = view.rename(columns={**COMPARISON_COLUMNS, **{c: f"{'M_0' if c.startswith('m0_') else 'M_1'} {c[3:]}"
                                                         for c in task_score_columns(df)}})

    def fmt(v):
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            if v != v:
                return "not reached"
            return f"{v:.3e}" if abs(v) >= 1e5 else f"{v:.4f}"
        return str(v)

    html = view.to_html(index=False, formatters={c: fmt for c in view.columns}, table_id="comparison")
    note = ("<p>Cost ratio = (FLOPs of all n small models + growth + refinement FLOPs until M_1 first "
            "reaches M_0's final validation loss) / M_0's total FLOPs. Below 1: growing was cheaper. "
            "'not reached': M_1 never reached M_0's final loss within the budget.</p>")
    sweep_html = ""
    if lr_sweep_csv is not None and Path(lr_sweep_csv).is_file():
        sweep = pd.read_csv(lr_sweep_csv)
        if sweep["lr"].nunique() > 1:
            sweep_html = ("<h3>Learning-rate sweep</h3><p>Every arm is compared at its own best peak learning rate "
                          "(lowest final validation loss averaged over the seeds; <b>chosen</b>).</p>"
                          + sweep.to_html(index=False, table_id="lr_sweep", float_format=lambda v: f"{v:.4f}",
                                          na_rep=""))
    Path(out_html).write_text(_html_page(
        "M_0 vs M_1", f"<h3>Comparison: M_0 (scratch) vs M_1 (grown)</h3>{note}{html}{sweep_html}"))


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

def task_score_columns(comparison: pd.DataFrame) -> list[str]:
    """The comparison's task columns (`m0_<task>/<metric>`, `m1_<task>/<metric>`), M_1's beside M_0's."""
    return [c for c in comparison.columns if c[:3] in ("m0_", "m1_") and "/" in c]


def task_failures(table: pd.DataFrame) -> list[str]:
    """'task X failed on MODEL: error' for every failed run of `tasks.csv`."""
    failed = table[table["error"].fillna("").astype(str) != ""]
    return [f"task {r['entry']} failed on {r['dir']}: {r['error']}" for _, r in failed.iterrows()]


def tasks_html(table: pd.DataFrame, out_html) -> None:
    """The task scores of every model (`tasks.csv`): one row per model, one column per task and metric
    (with its standard error), models in order of training FLOPs; failed runs listed above."""
    parts = ["<h3>Benchmark tasks (lm-evaluation-harness)</h3>"]
    failures = task_failures(table)
    if failures:
        parts.append("<p><b>Failed runs</b> (their scores are missing; every other result stands; the job's log has "
                     "the traceback):</p><ul>" + "".join(f"<li>{f}</li>" for f in failures) + "</ul>")
    ok = table[(table["error"].fillna("").astype(str) == "") & table["named"].astype(bool)].copy()
    if len(ok):
        ok["score"] = [f"{v:.4g}" + (f" ± {e:.2g}" if pd.notna(e) else "") for v, e in zip(ok["value"], ok["stderr"])]
        ok["arrow"] = ok["higher_is_better"].map({True: " ↑", False: " ↓", "True": " ↑", "False": " ↓"}).fillna("")
        ok["column"] = ok["task"] + " " + ok["metric"] + ok["arrow"]
        keys = ["arm", "method", "d0", "L0", "d1", "L1", "n", "seed", "budget", "lr"]
        # a model's empty sweep values (a member has no budget) as text, so that the pivot keeps its row
        for key in keys:
            ok[key] = ok[key].map(lambda v: "" if pd.isna(v) else str(int(v)) if isinstance(v, float)
                                  and v.is_integer() and key != "lr" else str(v))
        wide = ok.pivot_table(index=[*keys, "training_flops"], columns="column", values="score", aggfunc="first")
        wide = wide.reset_index().sort_values("training_flops")
        wide.columns.name = None
        wide["training_flops"] = wide["training_flops"].map(lambda v: f"{v:.3e}")
        parts.append("<p>Scores with their standard errors; ↑ higher is better, ↓ lower is better. Training FLOPs "
                     "count everything a model was made from (an M_1's members and growth included).</p>")
        parts.append(wide.to_html(index=False, table_id="tasks", na_rep=""))
    elif not failures:
        parts.append("<p>No task scores.</p>")
    Path(out_html).write_text(_html_page("Benchmark tasks", "".join(parts)))


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


def profile_html(summary_files: list[str], curves_csv, out_html) -> None:
    """The report's Profile section: per tool and model kind, phases, memory, top kernels, cost."""
    parts = ["<h3>Profile</h3>"]
    curves = pd.read_csv(curves_csv)
    last = curves.sort_values("step").groupby(["arm", "seed", "d0", "d1", "n", "method", "budget"]).tail(1)
    cost = last.assign(TFLOPs=last["flops"] / 1e12, achieved_GFLOP_per_s=last["flops"] / last["wall_s"] / 1e9)
    cost = cost[["arm", "method", "d0", "d1", "n", "seed", "TFLOPs", "wall_s", "achieved_GFLOP_per_s",
                 "peak_mem_mb"]].drop_duplicates(subset=["arm", "d0", "d1", "n", "seed"])
    parts.append("<h4>Training cost per model (whole runs): TFLOPs by growlm.flops and measured time</h4>")
    parts.append(cost.to_html(index=False, float_format=lambda v: f"{v:.3f}", table_id="profile-cost"))
    for summary_file in summary_files:
        folder = Path(summary_file).parent
        tool, kind = folder.parent.name, folder.name
        summary = pd.read_csv(summary_file)
        made_by = summary["profiler"].iloc[0] if len(summary) else "none"
        parts.append(f"<h4>{kind}: requested {tool}, tables made by <code>{made_by}</code></h4>")
        parts.append(summary.to_html(index=False, na_rep="", table_id=f"summary-{tool}-{kind}"))
        phases = pd.read_csv(folder / "phases.csv")
        if len(phases):
            parts.append(phases.to_html(index=False, float_format=lambda v: f"{v:.3f}"))
        kernels = pd.read_csv(folder / "kernels.csv").head(10)
        if len(kernels):
            parts.append(f"<p>Top {len(kernels)} kernels / operators by time</p>")
            parts.append(kernels.to_html(index=False, float_format=lambda v: f"{v:.3f}"))
        metrics = folder / "ncu_metrics.csv"
        if metrics.is_file():
            parts.append("<p>Nsight Compute metrics of the measured kernels</p>")
            parts.append(pd.read_csv(metrics).to_html(index=False, float_format=lambda v: f"{v:.2f}"))
    Path(out_html).write_text(_html_page("Profile", "".join(parts)))


def plans_html(plan_files: list[str], out_html) -> pd.DataFrame:
    """The memory plan every training job ran with (growlm.memory), one row per job."""
    rows = []
    for f in plan_files:
        plan = read_json(f)
        rows.append({"job": str(Path(f).parent).split("/models/", 1)[-1],
                     "strategy": plan["strategy"], "devices": plan["n_devices"], "device": plan["device_type"],
                     "global batch": plan["global_batch"], "micro-batch": plan["micro_batch_size"],
                     "accumulation": plan["grad_accum_steps"], "recomputation": plan["recompute"],
                     "precision": plan["precision"], "source": plan["source"],
                     "estimated peak MiB": plan["estimated_peak_bytes"] / 2**20,
                     "budget MiB": plan["budget_bytes"] / 2**20,
                     "re-planned after OOM": len(plan.get("history") or [])})
    df = pd.DataFrame(rows)
    html = df.to_html(index=False, float_format=lambda v: f"{v:.1f}", table_id="plans")
    Path(out_html).write_text(_html_page("Memory plans", f"<h3>Memory plan of every training job</h3>{html}"))
    return df


# ----------------------------------------------------------------------------------------------
# the first page: the answer
# ----------------------------------------------------------------------------------------------

def _ratio(mean: float, std: float, seeds: int) -> str:
    return f"{mean:.2f}" + (f" ± {std:.2f}" if seeds > 1 and std == std else "")


def _arm_sentence(method: str, arm: str, g: pd.DataFrame) -> str:
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
        return (f"{head}: {verdict}. M_1 reached M_0's final validation loss at {free} of M_0's FLOPs with {small} "
                f"free{partly} and ended at {m1:.3f} (M_0: {m0:.3f}); the members' own training cost is not counted: it is "
                f"not known (state it in members.cost to count it).")
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
    return (f"{head}: {verdict}. M_1 reached M_0's final validation loss {cost}{partly} and ended at {m1:.3f} "
            f"(M_0: {m0:.3f}).")


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
        out.append(f"M_0 (width {d1}, {layers(L1)}) trained from scratch for {int(budget):,} tokens ends at "
                   f"validation loss {group['m0_final_val_loss'].mean():.3f}; each M_1 has the same size and budget "
                   f"and {start}")
        for (method, arm), g in group.groupby(["method", "arm"], sort=False):
            out.append(_arm_sentence(method, arm, g))
        if "ensemble_test_loss" in group and group["ensemble_test_loss"].notna().any():
            out.append(f"The {n} members' untrained logit-average ensemble has test loss "
                       f"{group['ensemble_test_loss'].mean():.3f} on level {_test_level(group)}.")
    out += budget_sentences(df)
    out += task_sentences(df, pd.read_csv(tasks_csv) if tasks_csv else None)
    return out


def write_summary(comparison_csv, description_rst, out_rst, tasks_csv=None) -> None:
    """The report's first page (reST): the answer, then the workflow's description."""
    lines = ["growlm: does growing pay?", "=" * 25, ""]
    for sentence in summary_sentences(comparison_csv, tasks_csv):
        prefix = "" if sentence.startswith("M_0 (") or sentence.startswith("The ") else "* "
        lines += [prefix + sentence, ""]
    lines += ["Cost ratio: (FLOPs of the small models + growth + refinement FLOPs until M_1 first reaches M_0's final "
              "validation loss) / M_0's FLOPs; below 1, growing was cheaper than training from scratch. The table "
              f"under *Comparison* holds every number; ``{comparison_csv}`` every column.", "",
              "The experiment", "--------------", "", ""]
    Path(out_rst).write_text("\n".join(lines) + Path(description_rst).read_text())