"""The profiling driver: run a workload under Nsight Systems, Nsight Compute or torch.profiler.

`profile_run(tool, workload_cmd, out_dir, ...)` runs the workload command under the requested tool,
checks that the tool really produced data, and falls back where it did not (ncu -> torch.profiler
with CUDA kernels; nsys -> torch.profiler with CUDA activity -> CPU-only torch.profiler). It records
every attempt and its reason in `run.json`, keeps the raw exports, and writes the tidy tables
(`growlm.profiling.tables`). The workload must call `growlm.profiling.ranges.session_from_env`
(the training loop does). A missing or broken tool never raises; only a workload that fails under
every profiler does (GrowlmError, with the attempts recorded in run.json).

Command line: `python -m growlm.profiling TOOL OUT_DIR [--steps N --warmup W] [-- CMD...]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from growlm.errors import GrowlmError, package_env, user_errors
from growlm.profiling.demo import DEMO_WORKLOAD
from growlm.profiling.ranges import (CAPTURE_RANGE, ENV_PROFILE_DIR, ENV_PROFILER, ENV_STEPS, ENV_WARMUP,
                                     NVTX_DOMAIN, write_json)
from growlm.profiling.exports import NVTX_TOO_NEW, read_csv_export
from growlm.profiling.tables import write_tables
from growlm.profiling.tools import NCU_FAILURE_MARKERS, detect_tools, last_line, run_command

NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis",
                "LaunchStats")
# Extra metrics for the tensor-core column (Hopper names; ncu rejects unknown names, so
# profile_run retries without them if ncu complains).
NCU_EXTRA_METRICS = ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                     "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active")
NSYS_REPORTS = ("nvtx_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_size_sum", "cuda_gpu_mem_time_sum",
                "cuda_gpu_trace")
# Report names of Nsight Systems before 2023 (tried when the new name gives nothing).
NSYS_OLD_REPORTS = {"nvtx_sum": "nvtxsum", "cuda_gpu_kern_sum": "gpukernsum",
                    "cuda_gpu_mem_size_sum": "gpumemsizesum", "cuda_gpu_mem_time_sum": "gpumemtimesum",
                    "cuda_gpu_trace": "gputrace"}

_OUTPUTS = ("run.json", "workload.json", "tools.json", "profile.nsys-rep", "profile.qdstrm",
            "profile.sqlite", "profile.ncu-rep", "ncu_raw.csv", "torch_key_averages.csv",
            "torch_key_averages.txt", "torch_trace.json.gz", "phases.csv", "kernels.csv",
            "summary.csv", "ncu_metrics.csv", "nsys.log", "ncu.log", "torch.log")


def _clean(out_dir: Path) -> None:
    for name in _OUTPUTS:
        (out_dir / name).unlink(missing_ok=True)
    for p in out_dir.glob("nsys_*.csv"):
        p.unlink()


def _workload_env(mode: str, out_dir: Path, steps: int, warmup: int, extra: dict | None) -> dict:
    env = dict(os.environ)
    env.update(extra or {})
    env.update({ENV_PROFILER: mode, ENV_PROFILE_DIR: str(out_dir), ENV_STEPS: str(steps),
                ENV_WARMUP: str(warmup)})
    # The profiled process must find growlm even when it is not installed (e.g. a bare GPU box).
    return package_env(env)


NSYS_RETRY_S = 5  # the pause before the one retry of an nsys run that failed without writing a report


def _attempt_nsys(nsys, cmd, out_dir, env, timeout, *, cuda: bool = True) -> tuple[bool, str, list]:
    """nsys profile + nsys stats. With a GPU: CUDA, NVTX and OS-runtime trace in the
    cudaProfilerApi window. Without one: NVTX and OS-runtime trace in the workload's NVTX range
    CAPTURE_RANGE, so the phase table (nvtx_sum) is still nsys's own measurement."""
    if cuda:
        capture = ["--capture-range=cudaProfilerApi", "--trace=cuda,nvtx,osrt",
                   "--cuda-memory-usage=true"]
        reports = NSYS_REPORTS
    else:
        capture = ["--capture-range=nvtx", f"--nvtx-capture={CAPTURE_RANGE}@{NVTX_DOMAIN}",
                   "--trace=nvtx,osrt"]
        reports = ("nvtx_sum",)
        env = {**env, "NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}  # match unregistered strings too
    prof_cmd = [nsys, "profile", *capture, "--capture-range-end=stop", "--sample=none",
                "--cpuctxsw=none", "-o", str(out_dir / "profile.nsys-rep"),
                "--force-overwrite=true", *cmd]
    rc, out = run_command(prof_cmd, timeout=timeout, env=env)
    log = [f"$ {' '.join(map(str, prof_cmd))}", out]
    rep = out_dir / "profile.nsys-rep"
    if rc not in (0, 124, 127) and not rep.exists() and not list(out_dir.glob("*.qdstrm")):  # not a timeout
        # nsys failing before it writes anything (seen as "End of file" when two nsys sessions start on one
        # machine at once, as two workflows' profiling jobs can) is passing: one more try, a moment later
        time.sleep(NSYS_RETRY_S)
        rc, out = run_command(prof_cmd, timeout=timeout, env=env)
        log += [f"(nsys failed without a report: {last_line(log[1])}; tried again {NSYS_RETRY_S} s later)",
                f"$ {' '.join(map(str, prof_cmd))}", out]
    try:
        if not rep.exists():
            if list(out_dir.glob("*.qdstrm")):
                return False, "nsys wrote a .qdstrm but no .nsys-rep (QdstrmImporter missing?)", log
            if not cuda and rc == 0:
                return False, ("nsys captured nothing: it never saw the NVTX range "
                               f"{CAPTURE_RANGE}@{NVTX_DOMAIN} {NVTX_TOO_NEW}"), log
            return False, f"nsys produced no report (rc={rc}): {last_line(out)}", log
        if rc != 0:
            return False, f"workload under nsys exited with {rc}: {last_line(out)}", log
        made = []
        for report in reports:
            for name in (report, NSYS_OLD_REPORTS.get(report)):
                if name is None:
                    continue
                stats = [nsys, "stats", "--report", name, "--format", "csv", "--force-export=true",
                         "--output", str(out_dir / "nsys"), str(rep)]
                src, sout = run_command(stats, timeout=timeout, env=env)
                log += [f"$ {' '.join(map(str, stats))}", sout]
                produced = out_dir / f"nsys_{name}.csv"
                if produced.exists():
                    if name != report:  # old report name: store under the new one
                        produced.replace(out_dir / f"nsys_{report}.csv")
                    made.append(report)
                    break
        if "nvtx_sum" not in made and "cuda_gpu_kern_sum" not in made:
            return False, "nsys stats produced neither nvtx_sum nor cuda_gpu_kern_sum", log
        if not cuda and read_csv_export(out_dir / "nsys_nvtx_sum.csv").empty:
            return False, f"nsys recorded no NVTX ranges {NVTX_TOO_NEW}", log
        return True, f"nsys reports: {', '.join(made)}" + ("" if cuda else " (CPU: NVTX only)"), log
    finally:
        (out_dir / "nsys.log").write_text("\n".join(log))


def _attempt_ncu(ncu, cmd, out_dir, env, timeout, *, launch_count, kernel_filter, metrics):
    def command(with_metrics: bool):
        c = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--target-processes",
             "all", "--launch-count", str(launch_count)]
        if kernel_filter:
            c += ["--kernel-name", kernel_filter if kernel_filter.startswith(("regex:", "mangled:"))
                  else f"regex:{kernel_filter}"]
        for s in NCU_SECTIONS:
            c += ["--section", s]
        if with_metrics and metrics:
            c += ["--metrics", ",".join(metrics)]
        return c + ["-o", str(out_dir / "profile"), "--force-overwrite", *cmd]

    log = []
    try:
        for with_metrics in (True, False):
            prof_cmd = command(with_metrics)
            rc, out = run_command(prof_cmd, timeout=timeout, env=env)
            log += [f"$ {' '.join(map(str, prof_cmd))}", out]
            if with_metrics and metrics and ("Failed to find metric" in out or "metric" in out.lower()
                                             and "==ERROR==" in out and rc != 0):
                continue  # retry without the extra metrics
            break
        for marker in NCU_FAILURE_MARKERS:
            if marker in out:
                return False, f"ncu: {marker}", log
        rep = out_dir / "profile.ncu-rep"
        if rc != 0:
            return False, f"workload under ncu exited with {rc}: {last_line(out)}", log
        if not rep.exists():
            return False, f"ncu produced no report: {last_line(out)}", log
        imp = [ncu, "--import", str(rep), "--csv", "--page", "raw", "--print-units", "base"]
        irc, iout = run_command(imp, timeout=timeout)
        log += [f"$ {' '.join(map(str, imp))}", iout[:2000]]
        if irc != 0:
            return False, f"ncu --import failed (rc={irc}): {last_line(iout)}", log
        lines = [ln for ln in iout.splitlines() if ln.startswith('"')]
        if len(lines) < 3:
            return False, "ncu report holds no kernel rows (no kernel in the capture window?)", log
        (out_dir / "ncu_raw.csv").write_text("\n".join(lines) + "\n")
        return True, f"ncu profiled {len(lines) - 2} kernel launch(es)", log
    finally:
        (out_dir / "ncu.log").write_text("\n".join(log))


def _attempt_torch(mode, cmd, out_dir, env, timeout) -> tuple[bool, str, list]:
    rc, out = run_command(cmd, timeout=timeout, env=env)
    log = [f"$ {ENV_PROFILER}={mode} {' '.join(map(str, cmd))}", out]
    (out_dir / "torch.log").write_text("\n".join(log))
    if rc != 0:
        return False, f"workload under torch.profiler ({mode}) exited with {rc}: {last_line(out)}", log
    if not (out_dir / "torch_key_averages.csv").exists():
        return False, ("torch.profiler wrote no torch_key_averages.csv (did the training loop call "
                       "growlm.profiling.ranges.session_from_env and step_fn each step?)"), log
    meta = {}
    with contextlib.suppress(Exception):
        meta = json.loads((out_dir / "workload.json").read_text())
    label = meta.get("mode", mode if mode != "torch" else "torch-cuda")
    return True, f"torch.profiler ({label})", log


def profile_run(tool: str, workload_cmd: list[str], out_dir: str | Path, *, steps: int, warmup: int,
                kernel_filter: str | None = None, launch_count: int = 10, timeout: float = 3600,
                env: dict | None = None, fallback: bool = True,
                ncu_metrics: tuple[str, ...] = NCU_EXTRA_METRICS) -> dict:
    """Profile `workload_cmd` with `tool` (nsys | ncu | torch | torch-cpu), falling back on failure.

    The workload must honour the GROWLM_PROFILE* env vars (call `session_from_env`). Writes
    run.json (requested tool, the profiler that produced the data, every attempt with its reason),
    the raw exports, and the tables of `write_tables`. Returns the run.json dict plus "tables"."""
    tool = tool.strip().lower()
    if tool not in ("nsys", "ncu", "torch", "torch-cuda", "torch-cpu"):
        raise GrowlmError(f"unknown profiler {tool!r}: expected nsys, ncu, torch or torch-cpu")
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    _clean(out_dir)
    # Probe (cached) the requested Nsight tool first: a broken nsys can hang instead of failing.
    tools = detect_tools(probe=tool if tool in ("nsys", "ncu") and fallback else False)
    write_json(out_dir / "tools.json", tools)
    cuda = tools["cuda"]

    plan = {"nsys": ["nsys", "torch-cuda", "torch-cpu"], "ncu": ["ncu", "torch-cuda", "torch-cpu"],
            "torch": ["torch-cuda", "torch-cpu"], "torch-cuda": ["torch-cuda", "torch-cpu"],
            "torch-cpu": ["torch-cpu"]}[tool]
    if not fallback:
        plan = plan[:1]
    attempts, used = [], None
    for mode in plan:
        t0 = time.time()
        if mode == "torch-cuda" and not cuda:
            attempts.append({"profiler": mode, "ok": False, "seconds": 0.0,
                             "reason": "no CUDA device: torch.profiler records CPU activity only"})
            continue
        if mode in ("nsys", "ncu") and not tools[mode]["found"]:
            attempts.append({"profiler": mode, "ok": False, "seconds": 0.0,
                             "reason": tools[mode]["reason"]})
            continue
        if mode in ("nsys", "ncu") and tools[mode]["works"] is False:
            attempts.append({"profiler": mode, "ok": False, "seconds": 0.0,
                             "reason": f"{mode} probe failed: {tools[mode]['reason']}"})
            continue
        if mode == "ncu" and not cuda:
            attempts.append({"profiler": mode, "ok": False, "seconds": 0.0,
                             "reason": "no CUDA device: ncu has no GPU kernel to measure"})
            continue
        wenv = _workload_env("torch" if mode == "torch-cuda" else mode, out_dir, steps, warmup, env)
        try:
            if mode == "nsys":
                ok, why, _ = _attempt_nsys(tools["nsys"]["path"], workload_cmd, out_dir, wenv, timeout,
                                           cuda=cuda)
            elif mode == "ncu":
                ok, why, _ = _attempt_ncu(tools["ncu"]["path"], workload_cmd, out_dir, wenv, timeout,
                                          launch_count=launch_count, kernel_filter=kernel_filter,
                                          metrics=ncu_metrics)
            else:
                ok, why, _ = _attempt_torch(mode, workload_cmd, out_dir, wenv, timeout)
        except Exception as err:  # never let a tool problem escape
            ok, why = False, f"{mode} attempt crashed: {err!r}"
        attempts.append({"profiler": mode, "ok": ok, "seconds": round(time.time() - t0, 2),
                         "reason": why})
        if ok:
            used = mode
            if mode.startswith("torch"):  # the workload knows whether CUDA activity was recorded
                with contextlib.suppress(Exception):
                    used = json.loads((out_dir / "workload.json").read_text())["mode"]
            break
    run = {"requested": tool, "profiler": used, "steps": steps, "warmup": warmup,
           "workload_cmd": [str(c) for c in workload_cmd], "cuda": cuda, "device": tools["device"],
           "attempts": attempts,
           "fallback_reason": "; ".join(f"{a['profiler']}: {a['reason']}" for a in attempts
                                        if not a["ok"]) or None}
    write_json(out_dir / "run.json", run)
    if used is None:
        raise GrowlmError(f"profiling failed under every profiler ({' -> '.join(plan)}): "
                          f"{run['fallback_reason']}; logs in {out_dir}")
    run["tables"] = [str(p) for p in write_tables(out_dir)]
    return run


def main(argv: list[str] | None = None) -> int:
    """`python -m growlm.profiling TOOL OUT_DIR --steps N --warmup W [-- CMD...]` (the demo workload
    when no command is given); `python -m growlm.profiling detect` prints detect_tools()."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["detect"]:
        print(json.dumps(detect_tools(refresh="--refresh" in argv), indent=2))
        return 0
    cmd = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="python -m growlm.profiling")
    ap.add_argument("tool", choices=["nsys", "ncu", "torch", "torch-cpu"])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--kernel-filter")
    ap.add_argument("--launch-count", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args(argv)
    with user_errors("profile"):
        run = profile_run(args.tool, cmd or DEMO_WORKLOAD, args.out_dir, steps=args.steps,
                          warmup=args.warmup, kernel_filter=args.kernel_filter,
                          launch_count=args.launch_count, timeout=args.timeout)
        print(json.dumps({k: run[k] for k in ("requested", "profiler", "fallback_reason", "tables")},
                         indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
