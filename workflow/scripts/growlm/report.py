"""Figures and tables for the Snakemake report (seaborn plots, HTML tables)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

TABLE_STYLE = """<style>
body { font-family: sans-serif; font-size: 13px; }
table { border-collapse: collapse; }
th, td { border: 1px solid #bbb; padding: 3px 8px; text-align: right; }
th { background: #eee; }
caption { caption-side: top; text-align: left; font-weight: bold; padding: 4px 0; }
</style>"""


def _html_page(title: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>{TABLE_STYLE}</head><body>{body}</body></html>"


def corpus_stats_table(stats_files: list[str], *, csv_file, html_file) -> pd.DataFrame:
    rows = []
    for f in stats_files:
        stats = json.loads(Path(f).read_text())
        per_source = stats.pop("sources")
        if isinstance(per_source, dict):  # sentences kept per source
            stats["sources"] = len(per_source)
            stats["books"] = ", ".join(per_source)
        else:
            stats["sources"] = per_source
        rows.append(stats)
    df = pd.json_normalize(rows).sort_values("level")
    df.columns = [c.replace("splits.", "").replace(".", " ") for c in df.columns]
    df.to_csv(csv_file, index=False)
    html = df.to_html(index=False, float_format=lambda v: f"{v:.2f}", table_id="corpus-stats")
    Path(html_file).write_text(_html_page("Corpus statistics", f"<h3>Corpus statistics per reading level</h3>{html}"))
    return df


def loss_vs_flops_plot(curves_csv, comparison_csv, out_svg) -> None:
    """Validation loss against cumulative training FLOPs; M_1 starts at the small models' cost."""
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
        ax.set_ylabel("validation loss, level 1 (nats/token)")
        ax.set_title(f"d0={d0}, L0={L0} -> d1={d1}, L1={L1}, n={n}, budget {int(budget):,} tokens")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(out_svg)
    plt.close(fig)


COMPARISON_COLUMNS = {
    "method": "method", "arm": "arm", "d0": "d0", "L0": "L0", "d1": "d1", "L1": "L1", "n": "n", "members_used": "members used", "seed": "seed",
    "budget": "budget (tokens)", "m0_lr": "M_0 peak lr", "m1_lr": "M_1 peak lr",
    "m0_final_val_loss": "M_0 final val loss", "m1_final_val_loss": "M_1 final val loss",
    "m1_step0_val_loss": "M'_1 val loss at step 0",
    "m0_test_ppl": "M_0 test ppl", "m1_test_ppl": "M_1 test ppl",
    "m0_test_acc": "M_0 test acc", "m1_test_acc": "M_1 test acc",
    "unigram_test_loss": "unigram test loss",
    "ensemble_test_loss": "members' ensemble test loss (untrained)",
    "m0_flops": "M_0 FLOPs", "small_flops": "n small models' FLOPs",
    "m1_flops_to_m0_loss": "M_1 refine FLOPs to M_0's loss",
    "cost_ratio": "cost ratio (small counted)", "cost_ratio_small_free": "cost ratio (small models free)",
    "wall_ratio": "wall ratio (small counted)", "loss_gap_equal_flops": "loss gap at equal total FLOPs",
}


def comparison_html(comparison_csv, out_html, lr_sweep_csv=None) -> None:
    df = pd.read_csv(comparison_csv)
    cols = [c for c in COMPARISON_COLUMNS if c in df.columns]
    view = df[cols].astype(object)
    for col in ("m1_flops_to_m0_loss", "cost_ratio", "cost_ratio_small_free", "wall_ratio"):
        if col in view:
            view[col] = view[col].where(pd.notna(df[col]), "not reached")
    view = view.rename(columns=COMPARISON_COLUMNS)

    def fmt(v):
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
        plan = json.loads(Path(f).read_text())
        rows.append({"job": str(Path(f).parent).replace("results/models/", ""),
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
