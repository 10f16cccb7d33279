"""Profiling library: parsers on fixture exports, the torch.profiler path on CPU, tool fallback."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from growlm.errors import GrowlmError
from growlm.profiling import driver as D
from growlm.profiling import exports as E
from growlm.profiling import ranges as R
from growlm.profiling import tables as T
from growlm.profiling import tools as TL
from growlm.profiling.demo import DEMO_WORKLOAD

FIX = Path(__file__).parent / "fixtures" / "profile"


def test_to_num_tolerates_separators_quotes_and_junk():
    got = E.to_num(['"1,234.5"', " 12 ", "n/a", "", "3 %", "2,147,483,647"]).tolist()
    assert got[0] == 1234.5 and got[1] == 12 and math.isnan(got[2]) and math.isnan(got[3])
    assert got[4] == 3 and got[5] == 2147483647


def test_phase_name_strips_nvtx_domains():
    assert E.phase_name("growlm:forward") == "forward"
    assert E.phase_name(":eval") == "eval"
    assert E.phase_name(" Backward ") == "backward"
    assert E.phase_name("ProfilerStep#3") is None


def test_nsys_nvtx_sum_to_phases():
    df = E.nsys_phases(FIX / "nsys_nvtx_sum_format_sample.csv")
    assert list(df.columns) == E.PHASE_COLUMNS
    assert df["phase"].tolist() == ["data", "forward", "backward", "optimizer", "eval"]
    row = df.set_index("phase").loc["backward"]
    assert row["calls"] == 4 and row["total_ms"] == pytest.approx(48.0)
    assert row["mean_ms"] == pytest.approx(12.0)
    assert df["share"].sum() == pytest.approx(1.0)
    assert (df["profiler"] == "nsys").all()


def test_nsys_old_header_variant():
    df = E.nsys_phases(FIX / "nsys_nvtx_sum_old_format_sample.csv").set_index("phase")
    assert df.loc["forward", "total_ms"] == pytest.approx(1.2)
    assert df.loc["forward", "calls"] == 3


def test_nsys_nvtxsum_real_2022_4_export():
    """A real `nsys stats --report nvtxsum` export (Nsight Systems 2022.4.2, no GPU) of the demo
    workload, 5 captured steps: the capture range itself is not a phase."""
    df = E.nsys_phases(FIX / "nsys_nvtxsum_2022.4_cpu.csv").set_index("phase")
    assert list(df.index) == ["data", "forward", "backward", "optimizer", "eval"]
    assert df.loc[["data", "forward", "backward", "optimizer"], "calls"].tolist() == [5, 5, 5, 5]
    assert df.loc["eval", "calls"] == 1
    assert df.loc["forward", "total_ms"] == pytest.approx(119.390838)  # 119,390,838 ns
    assert df["share"].sum() == pytest.approx(1.0)


def test_nsys_kernels_and_gpu_busy():
    k = E.nsys_kernels(FIX / "nsys_cuda_gpu_kern_sum_format_sample.csv")
    assert list(k.columns) == E.KERNEL_COLUMNS
    assert k["kernel"].iloc[0].startswith("nvjet_sm90")
    assert k["total_ms"].tolist() == pytest.approx([6.0, 3.0, 1.0])
    assert k["calls"].tolist() == [40, 20, 100]
    assert k["share"].tolist() == pytest.approx([0.6, 0.3, 0.1])
    # intervals (ms): [1000,1002] [1002,1005] [1004,1006] [1008,1009] -> union 7 ms over a 9 ms span
    busy, busy_ms, window = E.nsys_gpu_busy(FIX / "nsys_cuda_gpu_trace_format_sample.csv", None)
    assert busy_ms == pytest.approx(7.0) and window == pytest.approx(9.0)
    assert busy == pytest.approx(7 / 9)
    assert E.nsys_gpu_busy(FIX / "nsys_cuda_gpu_trace_format_sample.csv", 10.0)[0] == pytest.approx(0.7)
    assert E.nsys_total_ms(FIX / "nsys_cuda_gpu_mem_time_sum_format_sample.csv") == pytest.approx(0.5)


def test_report_script_alias_units():
    assert E._ms_factor("Total Time:dur_ns") == pytest.approx(1e-6)
    assert E._ms_factor("Total Time (us)") == pytest.approx(1e-3)


def test_ncu_raw_format_sample():
    m = E.ncu_kernel_metrics(FIX / "ncu_raw_format_sample.csv")
    assert list(m.columns) == E.METRIC_COLUMNS
    assert m["launch"].tolist() == [0, 1, 2]
    assert m["duration_us"].tolist() == pytest.approx([1234.5, 12.25, 1000.0])  # usecond column
    assert m["sm_throughput_pct"].tolist() == pytest.approx([82.3, 20.0, 80.0])
    assert m["achieved_occupancy_pct"].tolist() == pytest.approx([12.4, 80.75, 12.0])
    assert m["dram_throughput_pct"].tolist() == pytest.approx([45.5, 88.1, 40.0])
    assert m["tensor_core_pct"].iloc[0] == pytest.approx(71.2)  # .avg, not the .max column
    assert math.isnan(m["tensor_core_pct"].iloc[2])
    k = E.ncu_kernels(m)
    gemm = k.set_index("kernel").loc["ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"]
    assert gemm["calls"] == 2 and gemm["total_ms"] == pytest.approx(2.2345)


def test_ncu_raw_real_h100_export():
    m = E.ncu_kernel_metrics(FIX / "ncu_raw_h100.csv")
    assert len(m) == 4 and m["kernel"].str.startswith(("nvjet_sm90", "cudnn_generated")).all()
    assert m["duration_us"].iloc[0] == pytest.approx(4.096)  # 4,096 ns
    assert m[["sm_throughput_pct", "achieved_occupancy_pct", "dram_throughput_pct",
              "tensor_core_pct"]].notna().all().all()
    assert m["tensor_core_pct"].iloc[1] == pytest.approx(13.53)  # the wgmma flash-attention kernel


def _nsys_dir(tmp_path: Path) -> Path:
    d = tmp_path / "nsys"
    d.mkdir()
    for report in D.NSYS_REPORTS:
        shutil.copy(FIX / f"nsys_{report}_format_sample.csv", d / f"nsys_{report}.csv")
    (d / "run.json").write_text(json.dumps({"requested": "nsys", "profiler": "nsys"}))
    (d / "workload.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "window_ms": 10.0,
                                                 "window_steps": 4, "peak_memory_mb": 512.0,
                                                 "peak_memory_source": "torch.cuda"}))
    return d


def test_write_tables_from_nsys_exports(tmp_path):
    d = _nsys_dir(tmp_path)
    paths = T.write_tables(d)
    assert sorted(p.name for p in paths) == ["kernels.csv", "phases.csv", "summary.csv"]
    s = pd.read_csv(d / "summary.csv")
    assert list(s.columns) == T.SUMMARY_COLUMNS
    assert s.loc[0, "profiler"] == "nsys" and s.loc[0, "gpu_busy_fraction"] == pytest.approx(0.7)
    assert s.loc[0, "peak_memory_mb"] == 512.0


def test_write_tables_from_ncu_export(tmp_path):
    shutil.copy(FIX / "ncu_raw_h100.csv", tmp_path / "ncu_raw.csv")
    paths = T.write_tables(tmp_path)
    assert "ncu_metrics.csv" in [p.name for p in paths]
    s = pd.read_csv(tmp_path / "summary.csv")
    assert s.loc[0, "profiler"] == "ncu" and pd.isna(s.loc[0, "gpu_busy_fraction"])
    assert list(pd.read_csv(tmp_path / "phases.csv").columns) == E.PHASE_COLUMNS


def test_torch_profiler_session_on_tiny_gpt2(tmp_path):
    from growlm.model import build_model

    model = build_model(seed=0, n_embd=32, n_layer=2, vocab_size=256, n_positions=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx, step = R.torch_profiler_session(tmp_path, warmup=1, active=2)
    with ctx:
        for _ in range(3):
            with R.phase("data"):
                x = torch.randint(0, 256, (2, 16))
            with R.phase("forward"):
                loss = model(input_ids=x, labels=x).loss
            with R.phase("backward"):
                loss.backward()
            with R.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            step()
    for name in ("torch_key_averages.csv", "torch_trace.json.gz", "workload.json"):
        assert (tmp_path / name).exists(), name
    T.write_tables(tmp_path)
    phases = pd.read_csv(tmp_path / "phases.csv")
    assert list(phases.columns) == E.PHASE_COLUMNS
    assert {"forward", "backward", "optimizer"} <= set(phases["phase"])
    assert (phases.set_index("phase").loc[["forward", "backward", "optimizer"], "calls"] == 2).all()
    kernels = pd.read_csv(tmp_path / "kernels.csv")
    assert list(kernels.columns) == E.KERNEL_COLUMNS and len(kernels) > 5
    assert (kernels["device"] == "cpu").all() and kernels["kernel"].str.startswith("aten::").any()
    assert not kernels["kernel"].isin(["forward", "ProfilerStep*"]).any()
    s = pd.read_csv(tmp_path / "summary.csv")
    assert s.loc[0, "profiler"] == "torch-cpu" and s.loc[0, "peak_memory_mb"] > 0
    assert s.loc[0, "window_steps"] == 2


def test_session_from_env_is_a_noop_without_env(monkeypatch, tmp_path):
    """Without GROWLM_PROFILER the session neither profiles nor writes anything; with it, the same
    call runs torch.profiler and writes its files (so the first half is not vacuous)."""
    monkeypatch.delenv(R.ENV_PROFILER, raising=False)
    monkeypatch.delenv(R.ENV_PROFILE_DIR, raising=False)
    out = tmp_path / "profile"
    ctx, step = R.session_from_env(warmup=1, steps=2, out_dir=out)
    with ctx:
        assert not torch.autograd.profiler._is_profiler_enabled
        for _ in range(3):
            with R.phase("forward"):
                torch.ones(4).sum()
            step()
    assert not out.exists()
    monkeypatch.setenv(R.ENV_PROFILER, "torch-cpu")
    ctx, step = R.session_from_env(warmup=1, steps=2, out_dir=out)
    with ctx:
        for _ in range(3):
            with R.phase("forward"):
                torch.ones(4).sum()
            step()
    assert (out / "workload.json").is_file() and (out / "torch_key_averages.csv").is_file()


def test_detect_tools_without_gpu_or_nsight(tmp_path, monkeypatch):
    broken = tmp_path / "bin" / "nsys"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{broken.parent}:/usr/bin:/bin")
    monkeypatch.setenv("GROWLM_TOOLS_CACHE", "0")
    monkeypatch.delenv("GROWLM_NSYS", raising=False)
    monkeypatch.setattr(TL, "_SEARCH", {})  # only PATH: ignore a real install under /opt/nvidia
    tools = TL.detect_tools()
    assert tools["cuda"] is False and tools["torch"]["works"] is True
    for name in ("nsys", "ncu"):
        assert tools[name]["works"] is False and tools[name]["reason"]
    assert tools["nsys"]["found"] is False  # the broken nsys fails --version
    json.dumps(tools)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
@pytest.mark.parametrize("tool", ["nsys", "ncu"])
def test_profile_run_falls_back_to_torch_cpu(tool, tmp_path, monkeypatch):
    monkeypatch.setenv("GROWLM_TOOLS_CACHE", "0")
    monkeypatch.setattr(TL, "find_tool", lambda name: [])  # neither Nsight tool installed
    run = D.profile_run(tool, DEMO_WORKLOAD, tmp_path, steps=2, warmup=1, timeout=120)
    assert run["requested"] == tool and run["profiler"] == "torch-cpu"
    assert [a["profiler"] for a in run["attempts"]] == [tool, "torch-cuda", "torch-cpu"]
    assert json.loads((tmp_path / "run.json").read_text())["profiler"] == "torch-cpu"
    phases = pd.read_csv(tmp_path / "phases.csv")
    assert (phases["profiler"] == "torch-cpu").all()
    assert {"data", "forward", "backward", "optimizer", "eval"} == set(phases["phase"])
    s = pd.read_csv(tmp_path / "summary.csv")
    assert s.loc[0, "requested_tool"] == tool and f"{tool}:" in s.loc[0, "notes"]
    assert (pd.read_csv(tmp_path / "kernels.csv")["profiler"] == "torch-cpu").all()


def test_profile_run_raises_when_the_workload_itself_fails(tmp_path):
    with pytest.raises(GrowlmError, match="every profiler"):
        D.profile_run("torch", [sys.executable, "-c", "raise SystemExit(2)"], tmp_path, steps=1,
                      warmup=0, timeout=60)
    assert json.loads((tmp_path / "run.json").read_text())["profiler"] is None


@pytest.fixture(scope="module")
def nsys_cli() -> str:
    """A real nsys: the one installed, else Debian 12's Nsight Systems 2022.4 (tests/nsight_systems.py)."""
    from nsight_systems import NsysUnavailable, ensure_nsys

    try:
        return ensure_nsys()
    except NsysUnavailable as err:
        pytest.skip(str(err))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks nsys without a GPU")
def test_profile_run_with_real_nsys_on_cpu(nsys_cli, tmp_path, monkeypatch):
    """nsys without a GPU traces the workload's NVTX ranges inside its capture range; the phase
    table comes from `nsys stats` and says so."""
    monkeypatch.setenv("GROWLM_NSYS", nsys_cli)
    monkeypatch.setenv("GROWLM_TOOLS_CACHE", "0")
    run = D.profile_run("nsys", DEMO_WORKLOAD, tmp_path, steps=3, warmup=2, timeout=300)
    assert run["profiler"] == "nsys", run["fallback_reason"]
    assert (tmp_path / "profile.nsys-rep").stat().st_size > 0
    phases = pd.read_csv(tmp_path / "phases.csv").set_index("phase")
    assert (phases["profiler"] == "nsys").all()
    # only the 3 captured steps, not the 2 warm-up steps; eval runs in the last step
    assert phases.loc[["data", "forward", "backward", "optimizer"], "calls"].tolist() == [3, 3, 3, 3]
    assert phases.loc["eval", "calls"] == 1 and (phases["total_ms"] > 0).all()
    s = pd.read_csv(tmp_path / "summary.csv")
    assert s.loc[0, "profiler"] == "nsys" and s.loc[0, "device"] == "cpu"
    assert pd.isna(s.loc[0, "gpu_busy_fraction"]) and "without a GPU" in s.loc[0, "notes"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks nsys without a GPU")
def test_nsys_that_sees_no_capture_range_falls_back_and_says_why(nsys_cli, tmp_path, monkeypatch):
    """A workload that never opens the NVTX capture range (what nvtx >= 0.2.12 looks like to
    Nsight Systems 2022.4): nsys captures nothing, torch.profiler takes over, run.json says why."""
    monkeypatch.setenv("GROWLM_NSYS", nsys_cli)
    monkeypatch.setenv("GROWLM_TOOLS_CACHE", "0")
    monkeypatch.setattr(D, "CAPTURE_RANGE", "a-range-nobody-opens")
    run = D.profile_run("nsys", DEMO_WORKLOAD, tmp_path, steps=1, warmup=1, timeout=300)
    assert run["profiler"] == "torch-cpu"
    assert "never saw the NVTX range a-range-nobody-opens@growlm" in run["fallback_reason"]


def _fake_nsys(tmp_path: Path, failures: int) -> Path:
    """An `nsys` that fails `failures` times without a report ("End of file", as Nsight Systems 2022.4 does
    when two sessions start at once), then profiles: writes the report and exports the real nvtxsum table."""
    script = tmp_path / "nsys"
    script.write_text(f"""#!{sys.executable}
import shutil, sys
from pathlib import Path
count = Path({str(tmp_path / "runs")!r})
args = sys.argv[1:]
if args[0] == "profile":
    n = int(count.read_text()) + 1 if count.exists() else 1
    count.write_text(str(n))
    if n <= {failures}:
        print("End of file")
        sys.exit(1)
    Path(args[args.index("-o") + 1]).write_text("report")
elif args[0] == "stats":
    report, out = args[args.index("--report") + 1], args[args.index("--output") + 1]
    shutil.copy({str(FIX / "nsys_nvtxsum_2022.4_cpu.csv")!r}, f"{{out}}_{{report}}.csv")
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.parametrize("failures, ok", [(1, True), (2, False)])
def test_nsys_failing_without_a_report_is_tried_once_more(tmp_path, monkeypatch, failures, ok):
    """A profile run that nsys ends before writing anything is tried once more (a passing failure: two
    sessions starting on one machine at once); a second failure falls back, naming nsys's message."""
    monkeypatch.setattr(D, "NSYS_RETRY_S", 0)
    out = tmp_path / "out"
    out.mkdir()
    worked, why, log = D._attempt_nsys(_fake_nsys(tmp_path, failures), ["true"], out, dict(os.environ),
                                       30, cuda=False)
    assert (tmp_path / "runs").read_text() == "2"  # one retry, never more
    assert any("tried again" in line for line in log)
    assert worked is ok
    if ok:
        assert why == "nsys reports: nvtx_sum (CPU: NVTX only)"
    else:
        assert why == "nsys produced no report (rc=1): End of file"
