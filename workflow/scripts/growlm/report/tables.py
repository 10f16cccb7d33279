"""The report's tables: HTML pages of the corpus, the comparison, the benchmark tasks, the profiles and
the training plans, each a self-contained page that Snakemake's report embeds.

The figures are in `growlm.report.figures`, the report's first page (its sentences) in
`growlm.report.summary`; both read the comparison's test level through `test_level` here.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from growlm.errors import read_json

TABLE_STYLE = """<style>
body { font-family: sans-serif; font-size: 13px; }
table { border-collapse: collapse; }
th, td { border: 1px solid #bbb; padding: 3px 8px; text-align: right; }
th { background: #eee; }
caption { caption-side: top; text-align: left; font-weight: bold; padding: 4px 0; }
</style>"""


def _html_page(title: str, body: str) -> str:
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>{TABLE_STYLE}</head><body>{body}</body></html>"


def test_level(comparison: pd.DataFrame) -> str:
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


COMPARISON_COLUMNS = {
    "method": "method", "arm": "arm",
    "multiplier": "effective compute multiplier (small counted)", "multiplier_low": "its 95% interval, low",
    "multiplier_high": "its 95% interval, high", "saving": "saving (by the interval)",
    "multiplier_free": "effective compute multiplier (small models free)",
    "extrapolated": "multiplier extrapolated past M_0's runs", "extrapolation_factor": "extrapolated by (FLOPs)",
    "seed_multiplier": "this seed's multiplier (small counted)",
    "envelope_ratio": "cost ratio by envelope (small counted)",
    "envelope_ratio_small_free": "cost ratio by envelope (small models free)",
    "reached": "reached M_0's loss within one schedule",
    "cost_ratio": "cost ratio within one schedule (small counted)",
    "cost_ratio_small_free": "cost ratio within one schedule (small models free)",
    "m0_final_val_loss": "M_0 final val loss", "m1_final_val_loss": "M_1 final val loss",
    "loss_gap_equal_flops": "loss gap at equal total FLOPs",
    "m0_final_val_loss_se": "M_0 final val loss's standard error", "m1_final_val_loss_se": "M_1 final val loss's standard error",
    "seed": "seed", "d0": "d0", "L0": "L0", "d1": "d1", "L1": "L1", "n": "n", "members_used": "members used",
    "budget": "budget (tokens)", "m0_lr": "M_0 peak lr", "m1_lr": "M_1 peak lr",
    "tokens_per_param": "tokens per non-embedding parameter of M_0", "tokens_per_param_total": "tokens per parameter of M_0",
    "m0_schedule": "M_0 lr schedule", "m1_schedule": "M_1 lr schedule", "members_schedule": "members' lr schedule",
    "members_grown_from": "members grown from",
    "m1_step0_val_loss": "M'_1 val loss at step 0",
    "m0_test_ppl": "M_0 test ppl", "m1_test_ppl": "M_1 test ppl",
    "m0_test_acc": "M_0 test acc", "m1_test_acc": "M_1 test acc",
    "unigram_test_loss": "unigram test loss",
    "ensemble_test_loss": "members' ensemble test loss (untrained)",
    "m0_flops": "M_0 FLOPs", "small_flops": "n small models' FLOPs",
    "m1_flops_to_m0_loss": "M_1 refine FLOPs to M_0's loss",
    "m0_passes": "passes over the large arms' text", "members_passes": "passes over a member's text",
    "m0_weight_decay": "M_0 weight decay", "m1_weight_decay": "M_1 weight decay",
    "envelope_runs": "runs in the envelopes (M_0+M_1)", "cooldown_flops": "cooldown branches' FLOPs (no arm's)",
    "wall_ratio": "wall ratio (small counted)",
    # how each arm was computed (growlm.modes): torch.compile and the CPU threads change the last digits
    "m0_mode": "M_0 computed", "m1_mode": "M_1 computed",
}


# the multiplier's columns, left out of the table where M_0 has too few finished runs to fit (one run per arm)
MULTIPLIER_VIEW = ("multiplier", "multiplier_low", "multiplier_high", "saving", "multiplier_free", "extrapolated",
                   "extrapolation_factor", "seed_multiplier")


def comparison_html(comparison_csv, out_html, lr_sweep_csv=None) -> None:
    df = pd.read_csv(comparison_csv)
    cols = [c for c in COMPARISON_COLUMNS if c in df.columns] + task_score_columns(df)
    if "multiplier_free" in df and df["multiplier_free"].isna().all():  # no fit of M_0's finished runs: no columns
        cols = [c for c in cols if c not in MULTIPLIER_VIEW]
    view = df[cols].astype(object)
    for col in ("multiplier", "multiplier_low", "multiplier_high", "multiplier_free", "seed_multiplier",
                "m0_final_val_loss_se", "m1_final_val_loss_se", "extrapolation_factor"):
        if col in view:  # empty where M_0's finished runs are too few to fit, or a ledger records no error
            view[col] = view[col].where(pd.notna(df[col]), "-")
    for col in ("m1_flops_to_m0_loss", "cost_ratio", "cost_ratio_small_free", "wall_ratio", "envelope_ratio",
                "envelope_ratio_small_free"):
        if col in view:
            view[col] = view[col].where(pd.notna(df[col]), "not reached")
    if "envelope_runs" in df:  # one run per arm (no branches, one budget): no envelope, not "not reached"
        single = df["envelope_runs"].astype(str) == "1+1"
        for col in ("envelope_ratio", "envelope_ratio_small_free"):
            view.loc[single, col] = "one run per arm"
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
    note = ("<p>Cost ratio = (FLOPs of all n small models + growth + refinement FLOPs until M_1 reaches M_0's final "
            "validation loss) / M_0's FLOPs. Below 1: growing was cheaper. <b>Effective compute multiplier</b>: the "
            "FLOPs M_0's fitted curve of finished runs needs for M_1's final loss over M_1's FLOPs; above 1, growing "
            "saved compute; a saving only where its 95% interval lies above 1. <b>By envelope</b>: where M_1's "
            "envelope of finished runs (its full runs' and cooldown branches' ends, complete runs of shorter "
            "budgets) gets to M_0's final loss, over where M_0's does. <b>Within one schedule</b>: M_1's first crossing inside its own run. "
            "'not reached': M_1 never reached M_0's final loss.</p>")
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


def profile_html(summary_files: list[str], curves_csv, out_html) -> None:
    """The report's Profile section: per tool and model kind, phases, memory, top kernels, cost."""
    parts = ["<h3>Profile</h3>"]
    curves = pd.read_csv(curves_csv)
    curves = curves[curves["run"] == "full"] if "run" in curves else curves  # whole runs, not cooldown branches
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


def where_it_ran(model_dir: Path) -> str:
    """Where a training job ran, from its growlm.json: each node with its processes' devices ("n1: cuda:0
    (GPU 3)"; the GPU as the machine numbers it, where the job was given devices of its own)."""
    meta = model_dir / "growlm.json"
    where = read_json(meta).get("where") if meta.is_file() else None
    if not where:
        return ""
    parts = []
    for node in where["nodes"]:
        ranks = [r for r in where["ranks"] if r["node"] == node]
        seen = [f"{r['device']}" + (f" (GPU {r['visible_devices']})" if r.get("visible_devices") else "")
                for r in ranks]
        parts.append(f"{node}: {', '.join(dict.fromkeys(seen))}" + (f" x {len(ranks)}" if len(ranks) > 1 else ""))
    return "; ".join(parts)


def plans_html(plan_files: list[str], out_html) -> pd.DataFrame:
    """The memory plan every training job ran with (growlm.memory), one row per job."""
    rows = []
    for f in plan_files:
        plan = read_json(f)
        rows.append({"job": str(Path(f).parent).split("/models/", 1)[-1], "where": where_it_ran(Path(f).parent),
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
