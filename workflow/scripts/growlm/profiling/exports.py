"""Parsers: each profiler's export -> tidy frames with the same columns whatever the tool.

Nsight Systems (`nsys stats --format csv` reports), Nsight Compute (`ncu --import --csv --page raw`)
and torch.profiler (`torch_key_averages.csv`, the chrome trace) each become

* phases:  profiler, phase, calls, total_ms, mean_ms, share
* kernels: profiler, kernel, device, calls, total_ms, mean_ms, share
* kernel metrics (ncu only): profiler, launch, kernel, duration_us, sm_throughput_pct,
  achieved_occupancy_pct, dram_throughput_pct, tensor_core_pct

plus the GPU busy fraction where a trace allows it. Column names of the exports differ between
Nsight versions, so columns are matched by lower-cased substrings, and numbers may carry thousands
separators or quotes. `growlm.profiling.tables` assembles one profile folder's tables from these.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from pathlib import Path

import pandas as pd

from growlm.profiling.ranges import PHASES

# Why an nsys report may hold no growlm NVTX range (measured with Debian 12's Nsight Systems 2022.4.2).
NVTX_TOO_NEW = ("(Nsight Systems 2022.4 ignores the ranges of the nvtx package from 0.2.12 on; growlm "
                "pins 0.2.11: see docs/profiling.md)")

PHASE_COLUMNS = ["profiler", "phase", "calls", "total_ms", "mean_ms", "share"]
KERNEL_COLUMNS = ["profiler", "kernel", "device", "calls", "total_ms", "mean_ms", "share"]
METRIC_COLUMNS = ["profiler", "launch", "kernel", "duration_us", "sm_throughput_pct",
                  "achieved_occupancy_pct", "dram_throughput_pct", "tensor_core_pct"]


# ------------------------------------------------------------------------------------ helpers

def find_col(df: pd.DataFrame, *needles: str, exclude: tuple[str, ...] = ()) -> str | None:
    """The first column whose lower-cased name equals, then contains, a needle (in needle order)."""
    cols = [(c, str(c).strip().lower()) for c in df.columns]
    for needle in needles:
        n = needle.lower()
        for c, low in cols:
            if low == n:
                return c
        for c, low in cols:
            if n in low and not any(x in low for x in exclude):
                return c
    return None


def to_num(values) -> pd.Series:
    """Numbers from strings like '1,234.5', '"12"', ' 3 %', 'n/a' (-> NaN)."""
    s = pd.Series(values, dtype="object").astype(str).str.strip()
    s = s.str.replace(r'["\',_\s%]', "", regex=True).str.replace("\u202f", "", regex=False)
    return pd.to_numeric(s, errors="coerce").astype(float)


def _ms_factor(colname: str, default: str = "ns") -> float:
    """Milliseconds per unit named in a column header such as 'Total Time (ns)'."""
    # 'Total Time (ns)' (nsys stats output) or 'Total Time:dur_ns' (nsys report-script alias)
    m = re.search(r"(?:\(|:dur_)(ns|us|μs|µs|ms|s|nsecond|usecond|msecond|second)\)?\s*$",
                  str(colname).strip().lower())
    return _unit_ms(m.group(1) if m else default)


def _unit_ms(unit: str) -> float:
    u = (unit or "").strip().lower()
    return {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "μs": 1e-3, "µs": 1e-3,
            "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}.get(u, 1e-6)


def read_csv_export(path: str | Path) -> pd.DataFrame:
    """Read a CSV export as strings, skipping any banner lines a tool printed before the header."""
    text = Path(path).read_text(errors="replace")
    lines = text.splitlines()
    start = 0
    for i, line in enumerate(lines):
        if line.count(",") >= 1 and not line.startswith(("==", "Processing", "NOTICE", "WARNING")):
            start = i
            break
    body = "\n".join(lines[start:])
    if not body.strip():
        return pd.DataFrame()
    return pd.read_csv(io.StringIO(body), dtype=str, keep_default_na=False, skipinitialspace=True)


def phase_name(raw: str) -> str | None:
    """'forward', ':forward', 'growlm:forward', ' growlm: forward ' -> 'forward'; others -> None."""
    name = str(raw).strip().strip('"')
    name = name.rsplit(":", 1)[-1].strip().lower()
    return name if name in PHASES else None


def finish_phases(df: pd.DataFrame, profiler: str) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame(columns=PHASE_COLUMNS)
    df = df.groupby("phase", as_index=False).agg(calls=("calls", "sum"), total_ms=("total_ms", "sum"))
    df["calls"] = df["calls"].astype(int)
    df["mean_ms"] = df["total_ms"] / df["calls"].where(df["calls"] > 0)
    total = df["total_ms"].sum()
    df["share"] = df["total_ms"] / total if total > 0 else math.nan
    df["order"] = df["phase"].map({p: i for i, p in enumerate(PHASES)})
    df = df.sort_values("order").drop(columns="order")
    df.insert(0, "profiler", profiler)
    return df[PHASE_COLUMNS].reset_index(drop=True)


def finish_kernels(df: pd.DataFrame, profiler: str, device: str) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    df = df.groupby("kernel", as_index=False, sort=False).agg(calls=("calls", "sum"),
                                                              total_ms=("total_ms", "sum"))
    df["calls"] = df["calls"].astype(int)
    df["mean_ms"] = df["total_ms"] / df["calls"].where(df["calls"] > 0)
    total = df["total_ms"].sum()
    df["share"] = df["total_ms"] / total if total > 0 else math.nan
    df["device"] = device
    df.insert(0, "profiler", profiler)
    df = df.sort_values("total_ms", ascending=False, kind="stable")
    return df[KERNEL_COLUMNS].reset_index(drop=True)


def union_ms(intervals) -> float:
    """Length of the union of (start, end) intervals (any unit in, same unit out)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


# --------------------------------------------------------------------------------------- nsys

def nsys_phases(nvtx_sum_csv: str | Path, profiler: str = "nsys") -> pd.DataFrame:
    """phases from `nsys stats --report nvtx_sum --format csv` (ranges named like PHASES)."""
    df = read_csv_export(nvtx_sum_csv)
    if df.empty:
        return finish_phases(df, profiler)
    name_c = find_col(df, "range", "name")
    total_c = find_col(df, "total time", "total")
    calls_c = find_col(df, "instances", "count", "calls")
    if name_c is None or total_c is None:
        raise ValueError(f"{nvtx_sum_csv}: no range/total-time columns in {list(df.columns)}")
    out = pd.DataFrame({"phase": df[name_c].map(phase_name),
                        "calls": to_num(df[calls_c]).fillna(0) if calls_c else 0,
                        "total_ms": to_num(df[total_c]) * _ms_factor(total_c)})
    return finish_phases(out.dropna(subset=["phase"]), profiler)


def nsys_kernels(kern_sum_csv: str | Path, profiler: str = "nsys") -> pd.DataFrame:
    """kernels from `nsys stats --report cuda_gpu_kern_sum --format csv`."""
    df = read_csv_export(kern_sum_csv)
    if df.empty:
        return finish_kernels(df, profiler, "gpu")
    name_c = find_col(df, "name", "kernel")
    total_c = find_col(df, "total time", "total")
    calls_c = find_col(df, "instances", "count", "calls")
    if name_c is None or total_c is None:
        raise ValueError(f"{kern_sum_csv}: no name/total-time columns in {list(df.columns)}")
    out = pd.DataFrame({"kernel": df[name_c].astype(str).str.strip(),
                        "calls": to_num(df[calls_c]).fillna(0) if calls_c else 0,
                        "total_ms": to_num(df[total_c]) * _ms_factor(total_c)})
    return finish_kernels(out, profiler, "gpu")


def nsys_total_ms(sum_csv: str | Path) -> float:
    """Sum of the 'Total Time' column of a *_sum report (kernels or memory operations)."""
    df = read_csv_export(sum_csv)
    total_c = find_col(df, "total time") if not df.empty else None
    if total_c is None:
        return math.nan
    return float(to_num(df[total_c]).sum() * _ms_factor(total_c))


def nsys_gpu_busy(gpu_trace_csv: str | Path, window_ms: float | None) -> tuple[float, float, float]:
    """(busy fraction, busy ms, window ms) from `cuda_gpu_trace`: union of kernel/memory intervals
    over the capture window (the workload's own window time if known, else the trace's span)."""
    df = read_csv_export(gpu_trace_csv)
    start_c = find_col(df, "start") if not df.empty else None
    dur_c = find_col(df, "duration", "dur") if not df.empty else None
    if start_c is None or dur_c is None:
        return math.nan, math.nan, math.nan
    start = to_num(df[start_c]) * _ms_factor(start_c)
    dur = to_num(df[dur_c]) * _ms_factor(dur_c)
    ok = start.notna() & dur.notna()
    intervals = list(zip(start[ok], (start + dur)[ok]))
    if not intervals:
        return math.nan, math.nan, math.nan
    busy = union_ms(intervals)
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    window = window_ms if window_ms and window_ms > 0 else span
    return min(1.0, busy / window) if window > 0 else math.nan, busy, window


# ---------------------------------------------------------------------------------------- ncu

_NCU_METRICS = {
    "duration": (["gpu__time_duration.sum", "gpu__time_duration"], ["duration"]),
    "sm_throughput_pct": (["sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput"],
                          ["compute (sm) throughput", "sm throughput"]),
    "achieved_occupancy_pct": (["sm__warps_active.avg.pct_of_peak_sustained_active",
                                "sm__warps_active"], ["achieved occupancy"]),
    "dram_throughput_pct": (["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                             "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                             "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                             "dram__throughput"], ["dram throughput", "memory throughput"]),
}


def _ncu_rows(path: str | Path) -> list[list[str]]:
    text = Path(path).read_text(errors="replace")
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    for i, r in enumerate(rows):  # skip ==PROF== banners etc.
        if any(str(c).strip().lower() in ("kernel name", "function name") for c in r):
            return rows[i:]
    raise ValueError(f"{path}: no 'Kernel Name' header row (not an `ncu --csv` export?)")


def ncu_kernel_metrics(raw_csv: str | Path, profiler: str = "ncu") -> pd.DataFrame:
    """One row per profiled kernel launch from `ncu --import R --csv --page raw` (header row of
    metric names, a row of units, then kernels) or `--page details` (one metric per row)."""
    rows = _ncu_rows(raw_csv)
    header = [h.strip() for h in rows[0]]
    low = [h.lower() for h in header]
    if "metric name" in low and "metric value" in low:
        return _ncu_details(rows, profiler)
    units, data = [""] * len(header), rows[1:]
    id_i = low.index("id") if "id" in low else None
    if data and (id_i is None or not to_num([data[0][id_i]]).notna().iloc[0]):
        units, data = [u.strip() for u in data[0]] + [""] * len(header), data[1:]
    df = pd.DataFrame([r + [""] * (len(header) - len(r)) for r in data], columns=header, dtype=str)
    unit_of = dict(zip(header, units))
    name_c = find_col(df, "kernel name", "function name", "demangled name", "name")
    out = pd.DataFrame({"launch": to_num(df[header[id_i]]) if id_i is not None
                        else pd.Series(range(len(df)), dtype=float),
                        "kernel": df[name_c].astype(str).str.strip()})
    for key, (names, _) in _NCU_METRICS.items():
        col = find_col(df, *names)
        vals = to_num(df[col]) if col is not None else pd.Series(math.nan, index=df.index)
        if key == "duration":
            unit = unit_of.get(col, "") if col is not None else ""
            out["duration_us"] = vals * _unit_ms(unit or "ns") * 1e3
        else:
            out[key] = vals
    # Tensor pipes: the per-SM average (.avg, not .max/.min) of every tensor-pipe utilisation
    # metric present (hmma = mma.sync, gmma = Hopper wgmma, ...); the busiest pipe wins.
    tensor_cols = [c for c in df.columns if "tensor" in c.lower() and ".avg.pct_of_peak" in c.lower()
                   and "_elapsed" not in c.lower()]
    tensor_cols = tensor_cols or [c for c in df.columns
                                  if "tensor" in c.lower() and ".avg.pct_of_peak" in c.lower()]
    out["tensor_core_pct"] = (pd.concat([to_num(df[c]) for c in tensor_cols], axis=1).max(axis=1)
                              if tensor_cols else math.nan)
    out.insert(0, "profiler", profiler)
    out["launch"] = out["launch"].fillna(pd.Series(range(len(out)), dtype=float)).astype(int)
    return out[METRIC_COLUMNS].reset_index(drop=True)


def _ncu_details(rows: list[list[str]], profiler: str) -> pd.DataFrame:
    df = pd.DataFrame(rows[1:], columns=[h.strip() for h in rows[0]], dtype=str)
    id_c = find_col(df, "id")
    name_c = find_col(df, "kernel name", "function name", "name")
    metric_c, unit_c, value_c = (find_col(df, "metric name"), find_col(df, "metric unit"),
                                 find_col(df, "metric value"))
    out = []
    for (launch, kernel), g in df.groupby([id_c, name_c], sort=False):
        names = g[metric_c].str.strip().str.lower()
        vals = to_num(g[value_c])
        row = {"profiler": profiler, "launch": int(to_num([launch]).iloc[0]), "kernel": kernel.strip()}
        for key, (_, labels) in _NCU_METRICS.items():
            hit = next((i for lab in labels for i, n in zip(g.index, names) if n == lab), None)
            v = vals.get(hit, math.nan) if hit is not None else math.nan
            if key == "duration":
                unit = g[unit_c].get(hit, "ns") if hit is not None and unit_c else "ns"
                row["duration_us"] = v * _unit_ms(unit) * 1e3
            else:
                row[key] = v
        tens = vals[names.str.contains("tensor") & g[unit_c].str.contains("%")] if unit_c else []
        row["tensor_core_pct"] = float(tens.max()) if len(tens) else math.nan
        out.append(row)
    return pd.DataFrame(out, columns=METRIC_COLUMNS)


def ncu_kernels(metrics: pd.DataFrame) -> pd.DataFrame:
    """kernels table (per kernel name) from ncu_kernel_metrics."""
    profiler = metrics["profiler"].iloc[0] if len(metrics) else "ncu"
    df = pd.DataFrame({"kernel": metrics["kernel"], "calls": 1,
                       "total_ms": metrics["duration_us"] / 1e3})
    return finish_kernels(df, profiler, "gpu")


# -------------------------------------------------------------------------------------- torch

_SKIP_OPS = re.compile(r"^(ProfilerStep(#\d+|\*)|\[memory\]|\[OutOfMemory\]|Optimizer\.step#.*|"
                       r"Optimizer\.zero_grad#.*)$")


def read_torch_key_averages(path: str | Path) -> pd.DataFrame:
    df = pd.read_csv(path, dtype={"name": str, "device_type": str}, keep_default_na=False)
    for c in df.columns:
        if c not in ("name", "device_type"):
            df[c] = to_num(df[c])
    return df


def torch_phases(key_avg_csv: str | Path, profiler: str) -> pd.DataFrame:
    """phases from torch_key_averages.csv: the record_function ranges named like PHASES
    (host-side wall time of the range, like NVTX ranges under nsys)."""
    df = read_torch_key_averages(key_avg_csv)
    cpu = df[~df.get("device_type", pd.Series("", index=df.index)).str.upper().str.contains("CUDA")]
    out = pd.DataFrame({"phase": cpu["name"].map(phase_name), "calls": cpu["count"],
                        "total_ms": cpu["cpu_time_total_us"] / 1e3})
    return finish_phases(out.dropna(subset=["phase"]), profiler)


def torch_kernels(key_avg_csv: str | Path, profiler: str) -> pd.DataFrame:
    """GPU kernels by self device time when CUDA activity was recorded, else CPU operators by
    self CPU time (record_function phase ranges and ProfilerStep markers left out)."""
    df = read_torch_key_averages(key_avg_csv)
    keep = ~df["name"].str.match(_SKIP_OPS) & df["name"].map(phase_name).isna()
    df = df[keep]
    dev_self = df.get("self_device_time_total_us", pd.Series(0.0, index=df.index)).fillna(0)
    dtype = df.get("device_type", pd.Series("", index=df.index)).str.upper()
    gpu = df[(dev_self > 0) & (dtype.str.contains("CUDA") | (df["self_cpu_time_total_us"].fillna(0) == 0))]
    if profiler != "torch-cpu" and len(gpu):
        out = pd.DataFrame({"kernel": gpu["name"], "calls": gpu["count"],
                            "total_ms": gpu["self_device_time_total_us"] / 1e3})
        return finish_kernels(out, profiler, "gpu")
    cpu = df[df["self_cpu_time_total_us"].fillna(0) > 0]
    out = pd.DataFrame({"kernel": cpu["name"], "calls": cpu["count"],
                        "total_ms": cpu["self_cpu_time_total_us"] / 1e3})
    return finish_kernels(out, profiler, "cpu")


def torch_trace_gpu_busy(trace_path: str | Path) -> tuple[float, float, float]:
    """(busy fraction, busy ms, window ms) from a torch.profiler chrome trace: union of GPU
    kernel/memcpy/memset events over the recorded ProfilerStep window. NaN without GPU events."""
    path = Path(trace_path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        events = json.load(fh)
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    gpu, steps = [], []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        s, d = float(e["ts"]), float(e["dur"])
        cat = str(e.get("cat", "")).lower()
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append((s, s + d))
        elif str(e.get("name", "")).startswith("ProfilerStep#"):
            steps.append((s, s + d))
    if not gpu:
        return math.nan, math.nan, math.nan
    lo = min(s for s, _ in steps) if steps else min(s for s, _ in gpu)
    hi = max([e for _, e in steps] + [e for _, e in gpu])
    clipped = [(max(s, lo), min(e, hi)) for s, e in gpu if e > lo and s < hi]
    busy_ms = union_ms(clipped) / 1e3
    window_ms = (hi - lo) / 1e3
    return (busy_ms / window_ms if window_ms > 0 else math.nan), busy_ms, window_ms
