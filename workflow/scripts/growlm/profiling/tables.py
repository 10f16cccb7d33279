"""One profile folder's tidy tables, whatever profiler made the data.

Every table has a `profiler` column naming what made the data (nsys, ncu, torch-cuda, torch-cpu):

* `phases.csv`:  profiler, phase, calls, total_ms, mean_ms, share
* `kernels.csv`: profiler, kernel, device, calls, total_ms, mean_ms, share
* `summary.csv`: profiler, requested_tool, device, gpu_busy_fraction, peak_memory_mb, window_ms,
  window_steps, kernels_total_ms, notes (what was measured how, and why a tool was not used)
* `ncu_metrics.csv` (ncu only): one row per profiled kernel launch

The parsers of each tool's export are in `growlm.profiling.exports`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from growlm.profiling.exports import (NVTX_TOO_NEW, finish_kernels, finish_phases, ncu_kernel_metrics, ncu_kernels,
                                      nsys_gpu_busy, nsys_kernels, nsys_phases, nsys_total_ms, torch_kernels,
                                      torch_phases, torch_trace_gpu_busy)

SUMMARY_COLUMNS = ["profiler", "requested_tool", "device", "gpu_busy_fraction", "peak_memory_mb",
                   "window_ms", "window_steps", "kernels_total_ms", "notes"]


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except Exception:
        return {}


def detect_profiler(out_dir: Path) -> str | None:
    """Which profiler made the data in out_dir: run.json's word, else guessed from the files."""
    run = _load_json(out_dir / "run.json")
    if run.get("profiler"):
        return run["profiler"]
    if (out_dir / "ncu_raw.csv").exists():
        return "ncu"
    if (out_dir / "nsys_nvtx_sum.csv").exists() or (out_dir / "nsys_cuda_gpu_kern_sum.csv").exists():
        return "nsys"
    if (out_dir / "torch_key_averages.csv").exists():
        return _load_json(out_dir / "workload.json").get("mode") or "torch-cpu"
    return None


def build_tables(out_dir: str | Path) -> dict[str, pd.DataFrame]:
    """phases, kernels, summary (and kernel_metrics for ncu) DataFrames from the files in out_dir."""
    out_dir = Path(out_dir)
    run = _load_json(out_dir / "run.json")
    work = _load_json(out_dir / "workload.json")
    profiler = detect_profiler(out_dir)
    notes = []
    if run.get("fallback_reason"):
        notes.append(f"fallback: {run['fallback_reason']}")
    busy = window_ms = math.nan
    metrics = None
    if profiler == "nsys":
        f = out_dir / "nsys_nvtx_sum.csv"
        phases = nsys_phases(f) if f.exists() else finish_phases(pd.DataFrame(), profiler)
        if phases.empty:
            notes.append(f"no growlm NVTX ranges in the nsys report {NVTX_TOO_NEW}")
        f = out_dir / "nsys_cuda_gpu_kern_sum.csv"
        kernels = nsys_kernels(f) if f.exists() else finish_kernels(pd.DataFrame(), profiler, "gpu")
        trace = out_dir / "nsys_cuda_gpu_trace.csv"
        if work.get("cuda") is False:
            notes.append("nsys without a GPU: NVTX ranges only (no kernels, no GPU busy fraction)")
        elif trace.exists():
            busy, _, window_ms = nsys_gpu_busy(trace, work.get("window_ms"))
            notes.append("gpu_busy_fraction: union of kernel+memory intervals (cuda_gpu_trace) "
                         "over the capture window")
        elif work.get("window_ms"):
            window_ms = work["window_ms"]
            gpu_ms = sum(x for x in (kernels["total_ms"].sum(),
                                     nsys_total_ms(out_dir / "nsys_cuda_gpu_mem_time_sum.csv")
                                     if (out_dir / "nsys_cuda_gpu_mem_time_sum.csv").exists() else 0)
                         if not math.isnan(x))
            busy = min(1.0, gpu_ms / window_ms)
            notes.append("gpu_busy_fraction: (kernel+memory time) / window, overlap not removed")
        notes.append("phase times: NVTX ranges (host wall time)")
    elif profiler == "ncu":
        metrics = ncu_kernel_metrics(out_dir / "ncu_raw.csv")
        phases = finish_phases(pd.DataFrame(), profiler)
        kernels = ncu_kernels(metrics)
        notes.append(f"ncu: {len(metrics)} kernel launch(es) replayed one at a time; no phase "
                     "times and no GPU busy fraction under ncu")
    elif profiler in ("torch-cuda", "torch-cpu", "torch"):
        ka = out_dir / "torch_key_averages.csv"
        phases = torch_phases(ka, profiler)
        kernels = torch_kernels(ka, profiler)
        trace = out_dir / "torch_trace.json.gz"
        if profiler == "torch-cuda" and trace.exists():
            busy, _, window_ms = torch_trace_gpu_busy(trace)
            notes.append("gpu_busy_fraction: union of GPU events over the ProfilerStep window "
                         "(torch.profiler trace)")
        notes.append("phase times: record_function ranges (host wall time)")
        if kernels["device"].eq("cpu").any():
            notes.append("kernels: CPU operators by self CPU time")
    else:
        raise ValueError(f"{out_dir}: no profile data (no run.json, nsys_*.csv, ncu_raw.csv or "
                         "torch_key_averages.csv)")
    if work.get("peak_memory_source"):
        notes.append(f"peak memory: {work['peak_memory_source']}")
    if isinstance(window_ms, float) and math.isnan(window_ms) and work.get("window_ms"):
        window_ms = work["window_ms"]
    summary = pd.DataFrame([{
        "profiler": profiler,
        "requested_tool": run.get("requested", profiler),
        "device": work.get("device") or run.get("device") or ("gpu" if profiler in ("nsys", "ncu")
                                                               else "cpu"),
        "gpu_busy_fraction": None if busy is None or math.isnan(busy) else round(float(busy), 6),
        "peak_memory_mb": work.get("peak_memory_mb"),
        "window_ms": window_ms if window_ms == window_ms else None,
        "window_steps": work.get("window_steps"),
        "kernels_total_ms": float(kernels["total_ms"].sum()) if len(kernels) else 0.0,
        "notes": "; ".join(notes),
    }], columns=SUMMARY_COLUMNS)
    tables = {"phases": phases, "kernels": kernels, "summary": summary}
    if metrics is not None:
        tables["kernel_metrics"] = metrics
    return tables


FILES = {"phases": "phases.csv", "kernels": "kernels.csv", "summary": "summary.csv",
         "kernel_metrics": "ncu_metrics.csv"}


def write_tables(out_dir: str | Path) -> list[Path]:
    """Write phases.csv, kernels.csv, summary.csv (+ ncu_metrics.csv when ncu made the data)."""
    out_dir = Path(out_dir)
    written = []
    for key, df in build_tables(out_dir).items():
        path = out_dir / FILES[key]
        df.to_csv(path, index=False)
        written.append(path)
    return written
