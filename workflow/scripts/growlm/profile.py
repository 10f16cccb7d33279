"""Profiling jobs: Nsight Systems (nsys), Nsight Compute (ncu) and a torch.profiler fallback.

Two sides:

* The **workload side** (the training loop, in the profiled process) calls
  `session_from_env(warmup=..., steps=...)` once and `step_fn()` after every training step, and
  wraps phases in `nvtx_range("forward")` etc. What the session does depends on the environment
  variables `profile_run` sets (see `ENV_*` below): open/close the cudaProfilerApi capture window
  for nsys/ncu, run `torch.profiler` for the fallback, or nothing at all when no variable is set.
  Every mode writes `workload.json` (device, peak memory, window wall time) into the profile dir.

* The **driver side** (`profile_run`) runs the workload command under the requested tool, checks
  that the tool really produced data, falls back (ncu -> torch.profiler with CUDA kernels;
  nsys -> torch.profiler with CUDA activity -> CPU-only torch.profiler), records every attempt in
  `run.json` and writes the tidy tables (`write_tables`, parsers in `growlm.profile_tables`).

A missing or broken tool never raises; only a workload that fails under every profiler does
(GrowlmError, with the attempts recorded in run.json).
"""

from __future__ import annotations

import contextlib
import csv
import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from growlm.errors import GrowlmError
from growlm.profile_tables import NVTX_TOO_NEW, read_csv_export

try:  # nvtx is a declared dependency; fall back to torch.cuda.nvtx where it is missing
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - depends on the environment
    _nvtx = None

PHASES = ("data", "forward", "backward", "optimizer", "eval", "grow")
NVTX_DOMAIN = "growlm"
# The NVTX range around the capture window: what nsys captures on a machine without a GPU
# (`--capture-range=nvtx --nvtx-capture=capture@growlm`; with a GPU it uses cudaProfilerApi).
CAPTURE_RANGE = "capture"

# Environment variables the training loop honours (through session_from_env).
ENV_PROFILER = "GROWLM_PROFILER"  # nsys | ncu | torch | torch-cpu | (unset/none: no profiling)
ENV_PROFILE_DIR = "GROWLM_PROFILE_DIR"  # where the workload writes workload.json / torch exports
ENV_WARMUP = "GROWLM_PROFILE_WARMUP"  # steps before the capture window (overrides the loop's value)
ENV_STEPS = "GROWLM_PROFILE_STEPS"  # steps inside the capture window (overrides the loop's value)

TOOLS = ("nsys", "ncu", "torch")
# Labels of the profiler that actually made the data (the `profiler` column of every table).
LABELS = ("nsys", "ncu", "torch-cuda", "torch-cpu")

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
# Strings in a tool's output that mean it could not measure anything.
NCU_FAILURE_MARKERS = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "No kernels were profiled",
                       "==ERROR== Failed", "==ERROR== Unknown", "==ERROR== Profiling failed",
                       "Failed to find metric", "Failed to profile", "not supported on this device")


# --------------------------------------------------------------------------------------------
# Workload side
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def nvtx_range(name: str, *, domain: str = NVTX_DOMAIN):
    """An NVTX range (Nsight) and a torch.profiler record_function range of the same name.

    Costs a few microseconds when no profiler is attached."""
    with contextlib.ExitStack() as stack:
        if _nvtx is not None:
            stack.enter_context(_nvtx.annotate(name, domain=domain))
        elif torch.cuda.is_available():  # pragma: no cover - GPU without the nvtx package
            torch.cuda.nvtx.range_push(name)
            stack.callback(torch.cuda.nvtx.range_pop)
        stack.enter_context(torch.profiler.record_function(name))
        yield


def _peak_memory() -> tuple[float, str]:
    """(peak memory in MiB, what it measures)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20, "torch.cuda.max_memory_allocated"
    try:
        import resource

        rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        return rss_kb / 1024, "process peak RSS (getrusage maxrss)"
    except Exception:  # pragma: no cover - non-POSIX
        return float("nan"), "unavailable"


def _device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


class _Window:
    """Counts steps; opens the capture window after `warmup` steps and closes it after `active`."""

    def __init__(self, out_dir: Path | None, mode: str, warmup: int, active: int):
        self.out_dir, self.mode, self.warmup, self.active = out_dir, mode, warmup, active
        self.steps_done = 0
        self.t_start = self.t_stop = None
        self._nvtx_open = False

    def _sync(self):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def open(self):
        self._sync()
        self.t_start = time.perf_counter()
        if self.mode in ("nsys", "ncu") and torch.cuda.is_available():
            torch.cuda.profiler.start()
        if self.mode == "nsys" and _nvtx is not None:
            # nsys without a GPU captures the NVTX range CAPTURE_RANGE (--capture-range=nvtx)
            _nvtx.push_range(CAPTURE_RANGE, domain=NVTX_DOMAIN)
            self._nvtx_open = True

    def close(self):
        if self.t_start is None or self.t_stop is not None:
            return
        self._sync()
        self.t_stop = time.perf_counter()
        if self.mode in ("nsys", "ncu") and torch.cuda.is_available():
            torch.cuda.profiler.stop()
        if self._nvtx_open:
            _nvtx.pop_range(domain=NVTX_DOMAIN)
            self._nvtx_open = False

    def step(self):
        self.steps_done += 1
        if self.steps_done == self.warmup:
            self.open()
        elif self.steps_done == self.warmup + self.active:
            self.close()

    def meta(self) -> dict:
        peak, peak_source = _peak_memory()
        window_ms = None
        if self.t_start is not None:
            window_ms = ((self.t_stop or time.perf_counter()) - self.t_start) * 1e3
        return {"mode": self.mode, "device": _device_name(), "cuda": torch.cuda.is_available(),
                "warmup": self.warmup, "active": self.active, "steps_done": self.steps_done,
                "window_steps": max(0, min(self.steps_done - self.warmup, self.active)),
                "window_ms": window_ms, "peak_memory_mb": peak, "peak_memory_source": peak_source,
                "torch": torch.__version__, "pid": os.getpid()}


@contextlib.contextmanager
def _window_ctx(window: _Window, prof=None):
    if window.warmup == 0:
        window.open()
    try:
        if prof is not None:
            with prof:
                yield
        else:
            yield
    finally:
        window.close()
        if window.out_dir is not None:
            _write_json(window.out_dir / "workload.json", window.meta())


def _key_average_rows(prof) -> list[dict]:
    rows = []
    for e in prof.key_averages():
        def g(*names, default=0.0):
            for n in names:
                if hasattr(e, n):
                    try:
                        return getattr(e, n)
                    except Exception:  # some attributes raise on CPU-only builds
                        continue
            return default

        rows.append({
            "name": e.key,
            "count": e.count,
            "device_type": str(g("device_type", default="")).split(".")[-1],
            "cpu_time_total_us": g("cpu_time_total"),
            "self_cpu_time_total_us": g("self_cpu_time_total"),
            "device_time_total_us": g("device_time_total", "cuda_time_total"),
            "self_device_time_total_us": g("self_device_time_total", "self_cuda_time_total"),
            "cpu_memory_usage_b": g("cpu_memory_usage"),
            "self_cpu_memory_usage_b": g("self_cpu_memory_usage"),
            "device_memory_usage_b": g("device_memory_usage", "cuda_memory_usage"),
        })
    return rows


def torch_profiler_session(out_dir: str | Path, warmup: int, active: int, *, cuda: bool | None = None):
    """A torch.profiler over `active` steps after `warmup` steps: returns (ctx, step_fn).

    Use as ``ctx, step = torch_profiler_session(d, 2, 5)`` then ``with ctx: for ...: train; step()``.
    On leaving the window it writes into out_dir: `torch_key_averages.csv` (one row per operator /
    kernel / record_function range), `torch_key_averages.txt` (the printed table),
    `torch_trace.json.gz` (chrome trace, open in Perfetto) and `workload.json`.
    `cuda=None` adds CUDA activity when a GPU is available."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    use_cuda = torch.cuda.is_available() if cuda is None else (cuda and torch.cuda.is_available())
    activities = [torch.profiler.ProfilerActivity.CPU]
    if use_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    window = _Window(out_dir, "torch-cuda" if use_cuda else "torch-cpu", warmup, active)

    def on_trace_ready(prof):
        rows = _key_average_rows(prof)
        with open(out_dir / "torch_key_averages.csv", "w", newline="") as fh:
            fields = list(rows[0]) if rows else ["name", "count"]
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        sort = "self_cuda_time_total" if use_cuda else "self_cpu_time_total"
        try:
            table = prof.key_averages().table(sort_by=sort, row_limit=60)
        except Exception:  # pragma: no cover - sort key renamed in some version
            table = prof.key_averages().table(row_limit=60)
        (out_dir / "torch_key_averages.txt").write_text(table)
        prof.export_chrome_trace(str(out_dir / "torch_trace.json.gz"))

    # torch's own schedule: `wait` steps idle, 1 profiler-warm-up step, then `active` recorded.
    schedule = torch.profiler.schedule(wait=max(warmup - 1, 0), warmup=min(warmup, 1), active=active,
                                       repeat=1)
    prof = torch.profiler.profile(activities=activities, schedule=schedule,
                                  on_trace_ready=on_trace_ready, record_shapes=False,
                                  profile_memory=True, with_stack=False)

    def step_fn():
        prof.step()
        window.step()

    return _window_ctx(window, prof), step_fn


def session_from_env(*, warmup: int, steps: int, out_dir: str | Path | None = None):
    """What the training loop calls: (ctx, step_fn) for the profiler `profile_run` asked for.

    GROWLM_PROFILER=nsys|ncu: opens the cudaProfilerApi window (torch.cuda.profiler.start/stop)
    after `warmup` steps for `steps` steps, and for nsys also the NVTX range CAPTURE_RANGE (what
    nsys captures where there is no GPU). =torch|torch-cuda|torch-cpu: torch.profiler session.
    Unset/none: a no-op (ctx does nothing, step_fn is cheap). GROWLM_PROFILE_WARMUP/_STEPS
    override the arguments; GROWLM_PROFILE_DIR overrides out_dir."""
    mode = os.environ.get(ENV_PROFILER, "").strip().lower()
    warmup = int(os.environ.get(ENV_WARMUP, warmup))
    steps = int(os.environ.get(ENV_STEPS, steps))
    env_dir = os.environ.get(ENV_PROFILE_DIR)
    out = Path(env_dir) if env_dir else (Path(out_dir) if out_dir is not None else None)
    if mode in ("", "none", "0", "off"):
        return contextlib.nullcontext(), (lambda: None)
    if out is None:
        raise GrowlmError(f"{ENV_PROFILER}={mode} needs {ENV_PROFILE_DIR} (where to write the profile)")
    out.mkdir(parents=True, exist_ok=True)
    if mode in ("torch", "torch-cuda", "torch-cpu"):
        return torch_profiler_session(out, warmup, steps, cuda=(mode != "torch-cpu"))
    if mode in ("nsys", "ncu"):
        window = _Window(out, mode, warmup, steps)
        return _window_ctx(window), window.step
    raise GrowlmError(f"{ENV_PROFILER}={mode!r}: expected one of nsys, ncu, torch, torch-cpu, none")


def _demo_workload(steps: int = 3, warmup: int = 1, *, width: int = 64, seq: int = 32,
                   batch: int = 8, vocab: int = 128) -> None:
    """A tiny stand-alone training loop (plain torch, no transformers) used by the tests and the
    probes; honours the same env vars as the real training loop. Run it as
    ``python -c "from growlm.profile import _demo_workload as w; w()"``."""
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, width),
        torch.nn.TransformerEncoderLayer(width, nhead=max(1, width // 16), dim_feedforward=4 * width,
                                         batch_first=True, dropout=0.0),
        torch.nn.Linear(width, vocab),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx, step_fn = session_from_env(warmup=warmup, steps=steps)
    total = int(os.environ.get(ENV_WARMUP, warmup)) + int(os.environ.get(ENV_STEPS, steps))
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if dev == "cuda"
                else contextlib.nullcontext())
    with ctx:
        for i in range(total):
            with nvtx_range("data"):
                x = torch.randint(0, vocab, (batch, seq), device=dev)
            with nvtx_range("forward"), autocast:
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(),
                                                         x[:, 1:].reshape(-1))
            with nvtx_range("backward"):
                loss.backward()
            with nvtx_range("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            if i == total - 1:
                with nvtx_range("eval"), torch.no_grad():
                    model(x)
            step_fn()


DEMO_WORKLOAD = [sys.executable, "-c", "from growlm.profile import _demo_workload as w; w()"]


# --------------------------------------------------------------------------------------------
# Tool discovery
# --------------------------------------------------------------------------------------------

_SEARCH = {
    "nsys": ["/opt/nvidia/nsight-systems*/bin/nsys", "/opt/nvidia/nsight-systems*/*/bin/nsys",
             "/opt/nvidia/nsight-systems*/*/target-linux-x64/nsys",
             "/usr/local/cuda*/bin/nsys", "/usr/local/cuda*/nsight-systems*/bin/nsys",
             "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
             "/opt/nvidia/nsight-*/**/nsys"],
    "ncu": ["/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
            "/usr/local/cuda*/nsight-compute*/ncu", "/opt/nvidia/nsight-*/**/ncu"],
}
_TOOLS_CACHE: dict[str, dict] = {}


def find_tool(name: str) -> list[str]:
    """Candidate executables for nsys / ncu: $GROWLM_<NAME>, PATH, then the usual install dirs."""
    found = []
    override = os.environ.get(f"GROWLM_{name.upper()}")
    if override:
        found.append(override)
    on_path = shutil.which(name)
    if on_path:
        found.append(on_path)
    for pattern in _SEARCH.get(name, []):
        for p in sorted(glob.glob(pattern, recursive="**" in pattern), reverse=True):
            if os.path.isfile(p) and os.access(p, os.X_OK):
                found.append(p)
    seen, out = set(), []
    for p in found:
        real = os.path.realpath(p)
        if real not in seen and os.path.isfile(real):
            seen.add(real)
            out.append(p)
    return out


def _run(cmd, *, timeout: float, env=None, cwd=None) -> tuple[int, str]:
    """Run a command (own process group so a timeout kills its children); (rc, stdout+stderr)."""
    try:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, cwd=cwd, start_new_session=True,
                                errors="replace")
    except OSError as err:
        return 127, f"{err}"
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, (out or "") + f"\n[growlm] timed out after {timeout:.0f} s"


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _cuda_available() -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover
        return False


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "growlm" / "profile_tools.json"


def _cache_key(name: str, path: str) -> str:
    st = os.stat(path)
    raw = "|".join([name, os.path.realpath(path), str(st.st_mtime), socket.gethostname(),
                    sys.executable, os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                    str(_cuda_available())])
    return hashlib.sha1(raw.encode()).hexdigest()


def _qdstrm_importer_missing(path: str) -> bool:
    """nsys copies shipped inside Nsight Compute lack the QdstrmImporter that turns the raw
    .qdstrm into a .nsys-rep (and may hang): detect that without running anything."""
    real = os.path.realpath(path)
    if "nsight-compute" not in real:
        return False
    root = Path(real).parent.parent.parent  # <ncu>/<ver>/host/target-linux-x64/nsys -> <ncu>/<ver>
    return not any(root.glob("**/QdstrmImporter*"))


def _probe_nsys(path: str, cuda: bool, timeout: float) -> tuple[bool, str]:
    if _qdstrm_importer_missing(path):
        return False, ("nsys inside Nsight Compute has no QdstrmImporter: it writes a .qdstrm but "
                       "no .nsys-rep; install Nsight Systems")
    with tempfile.TemporaryDirectory(prefix="growlm-nsys-probe-") as tmp:
        snippet = "import torch; torch.ones(8, device='cuda').sum().item()" if cuda else "pass"
        trace = "cuda,osrt" if cuda else "osrt"
        rc, out = _run([path, "profile", f"--trace={trace}", "--sample=none", "--cpuctxsw=none",
                        "-o", f"{tmp}/probe", "--force-overwrite=true", sys.executable, "-c", snippet],
                       timeout=timeout)
        rep = Path(tmp, "probe.nsys-rep")
        if not rep.exists():
            qd = list(Path(tmp).glob("*.qdstrm"))
            why = ("wrote a .qdstrm but no .nsys-rep (QdstrmImporter missing?)" if qd
                   else f"no report (rc={rc}): {_first_line(out)}")
            return False, why
        # report names of Nsight Systems 2023+, then the older ones
        for report in (("cuda_api_sum", "cudaapisum") if cuda else ("osrt_sum", "osrtsum")):
            rc, out = _run([path, "stats", "--report", report, "--format", "csv",
                            "--force-export=true", "--output", f"{tmp}/probe", str(rep)],
                           timeout=timeout)
            if rc == 0 and list(Path(tmp).glob("probe_*.csv")):
                return True, "nsys profile + nsys stats work"
        return False, f"nsys stats failed (rc={rc}): {_first_line(out)}"


def _probe_ncu(path: str, cuda: bool, timeout: float) -> tuple[bool, str]:
    if not cuda:
        return False, "no CUDA device: ncu has nothing to profile"
    snippet = "import torch; x=torch.ones(1<<20, device='cuda'); (x*2).sum().item()"
    rc, out = _run([path, "--target-processes", "all", "--launch-count", "1", "--section",
                    "SpeedOfLight", "--csv", sys.executable, "-c", snippet], timeout=timeout)
    for marker in NCU_FAILURE_MARKERS:
        if marker in out:
            return False, f"ncu cannot read counters: {marker}"
    if rc != 0:
        return False, f"ncu probe failed (rc={rc}): {_first_line(out)}"
    if "Duration" not in out and "gpu__time_duration" not in out:
        return False, "ncu probe produced no metrics"
    return True, "ncu reads hardware counters"


def detect_tools(*, probe: bool | str = True, refresh: bool = False, timeout: float = 60) -> dict:
    """Which profilers exist and work here. Never raises.

    Returns {"cuda": bool, "device": str, "nsys": {...}, "ncu": {...}, "torch": {...}} where each
    tool entry has path, candidates, version, found, works (None when not probed) and reason.
    probe=True probes both tools, probe="nsys"/"ncu" only that one, False none. A probe that runs
    past `timeout` seconds counts as not working (a broken nsys can hang).
    Probe results are cached in-process and in ~/.cache/growlm/profile_tools.json (keyed by the
    binary, its mtime, the host, the Python and CUDA_VISIBLE_DEVICES); refresh=True re-probes."""
    cuda = _cuda_available()
    try:
        device = torch.cuda.get_device_name(0) if cuda else "cpu"
    except Exception:  # pragma: no cover
        device = "cuda"
    result = {"cuda": cuda, "device": device,
              "torch": {"found": True, "version": torch.__version__, "works": True,
                        "reason": "CPU+CUDA activities" if cuda else "CPU activity only"}}
    disk = {}
    if probe is not False and not refresh and os.environ.get("GROWLM_TOOLS_CACHE", "1") != "0":
        with contextlib.suppress(Exception):
            disk = json.loads(_cache_file().read_text())
    dirty = False
    for name in ("nsys", "ncu"):
        entry = {"found": False, "path": None, "candidates": [], "version": None, "works": False,
                 "reason": f"{name} not found on PATH nor under /opt/nvidia, /usr/local/cuda*"}
        try:
            candidates = find_tool(name)
        except Exception as err:  # pragma: no cover
            candidates, entry["reason"] = [], f"search failed: {err}"
        entry["candidates"] = candidates
        for path in candidates:
            rc, out = _run([path, "--version"], timeout=30)
            if rc != 0:
                entry.update(path=path, reason=f"{path} --version failed (rc={rc})")
                continue
            entry.update(found=True, path=path, version=_first_line(out), works=None,
                         reason="not probed")
            if probe is False or (isinstance(probe, str) and probe != name):
                break
            key = _cache_key(name, path)
            cached = _TOOLS_CACHE.get(key) or (None if refresh else disk.get(key))
            if cached is None:
                prober = _probe_nsys if name == "nsys" else _probe_ncu
                try:
                    works, why = prober(path, cuda, timeout)
                except Exception as err:  # pragma: no cover - never let a probe raise
                    works, why = False, f"probe crashed: {err!r}"
                cached = {"works": works, "reason": why, "when": time.time()}
                _TOOLS_CACHE[key] = disk[key] = cached
                dirty = True
            entry.update(works=cached["works"], reason=cached["reason"])
            if entry["works"]:
                break
        result[name] = entry
    if dirty and os.environ.get("GROWLM_TOOLS_CACHE", "1") != "0":
        with contextlib.suppress(Exception):
            _write_json(_cache_file(), disk)
    return result


# --------------------------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------------------------

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
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    return env


def _tail(text: str, n: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


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
    rc, out = _run(prof_cmd, timeout=timeout, env=env)
    log = [f"$ {' '.join(map(str, prof_cmd))}", out]
    try:
        rep = out_dir / "profile.nsys-rep"
        if not rep.exists():
            if list(out_dir.glob("*.qdstrm")):
                return False, "nsys wrote a .qdstrm but no .nsys-rep (QdstrmImporter missing?)", log
            if not cuda and rc == 0:
                return False, ("nsys captured nothing: it never saw the NVTX range "
                               f"{CAPTURE_RANGE}@{NVTX_DOMAIN} {NVTX_TOO_NEW}"), log
            return False, f"nsys produced no report (rc={rc}): {_first_line(out)}", log
        if rc != 0:
            return False, f"workload under nsys exited with {rc}: {_first_line(out)}", log
        made = []
        for report in reports:
            for name in (report, NSYS_OLD_REPORTS.get(report)):
                if name is None:
                    continue
                stats = [nsys, "stats", "--report", name, "--format", "csv", "--force-export=true",
                         "--output", str(out_dir / "nsys"), str(rep)]
                src, sout = _run(stats, timeout=timeout, env=env)
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
            rc, out = _run(prof_cmd, timeout=timeout, env=env)
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
            return False, f"workload under ncu exited with {rc}: {_first_line(out)}", log
        if not rep.exists():
            return False, f"ncu produced no report: {_first_line(out)}", log
        imp = [ncu, "--import", str(rep), "--csv", "--page", "raw", "--print-units", "base"]
        irc, iout = _run(imp, timeout=timeout)
        log += [f"$ {' '.join(map(str, imp))}", iout[:2000]]
        if irc != 0:
            return False, f"ncu --import failed (rc={irc}): {_first_line(iout)}", log
        lines = [ln for ln in iout.splitlines() if ln.startswith('"')]
        if len(lines) < 3:
            return False, "ncu report holds no kernel rows (no kernel in the capture window?)", log
        (out_dir / "ncu_raw.csv").write_text("\n".join(lines) + "\n")
        return True, f"ncu profiled {len(lines) - 2} kernel launch(es)", log
    finally:
        (out_dir / "ncu.log").write_text("\n".join(log))


def _attempt_torch(mode, cmd, out_dir, env, timeout) -> tuple[bool, str, list]:
    rc, out = _run(cmd, timeout=timeout, env=env)
    log = [f"$ {ENV_PROFILER}={mode} {' '.join(map(str, cmd))}", out]
    (out_dir / "torch.log").write_text("\n".join(log))
    if rc != 0:
        return False, f"workload under torch.profiler ({mode}) exited with {rc}: {_first_line(out)}", log
    if not (out_dir / "torch_key_averages.csv").exists():
        return False, ("torch.profiler wrote no torch_key_averages.csv (did the training loop call "
                       "growlm.profile.session_from_env and step_fn each step?)"), log
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
    _write_json(out_dir / "tools.json", tools)
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
    _write_json(out_dir / "run.json", run)
    if used is None:
        raise GrowlmError(f"profiling failed under every profiler ({' -> '.join(plan)}): "
                          f"{run['fallback_reason']}; logs in {out_dir}")
    run["tables"] = [str(p) for p in write_tables(out_dir)]
    return run


def write_tables(out_dir: str | Path) -> list[Path]:
    """Write phases.csv, kernels.csv, summary.csv (+ ncu_metrics.csv when ncu made the data)."""
    from growlm.profile_tables import write_tables as _write

    return _write(Path(out_dir))


def main(argv: list[str] | None = None) -> int:
    """`python -m growlm.profile TOOL OUT_DIR --steps N --warmup W [-- CMD...]` (demo workload
    when no command is given); `python -m growlm.profile detect` prints detect_tools()."""
    import argparse

    from growlm.errors import user_errors

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["detect"]:
        print(json.dumps(detect_tools(refresh="--refresh" in argv), indent=2))
        return 0
    cmd = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="python -m growlm.profile")
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
