"""What runs inside a training process: named phase ranges and the profiler's capture window.

`phase("forward")` opens an NVTX range (Nsight) and a `torch.profiler.record_function` range of the
same name; it costs a few microseconds when no profiler is attached. The names are the ones the
profiling tables group by (`PHASES`).

The training loop calls `session_from_env(warmup=..., steps=...)` once and `step_fn()` after every
training step. What the session does depends on the environment variables the profiling driver
(`growlm.profiling.driver.profile_run`) sets (`ENV_*`): open/close the cudaProfilerApi capture window
for nsys/ncu (and, for nsys on a machine without a GPU, the NVTX range `capture@growlm` that nsys
captures instead), run `torch.profiler` for the fallback, or nothing at all when no variable is set.
Every mode writes `workload.json` (device, peak memory, window wall time) into the profile folder.
"""

from __future__ import annotations

import contextlib
import csv
import os
import resource
import time
from pathlib import Path

import torch

from growlm.atomic import write_json_atomic
from growlm.errors import GrowlmError

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


@contextlib.contextmanager
def phase(name: str, *, domain: str = NVTX_DOMAIN):
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
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return rss_kb / 1024, "process peak RSS (getrusage maxrss)"


def _device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


def write_json(path: Path, data: dict) -> None:
    """Write `data` as JSON, atomically (`growlm.atomic`: the profile-tools cache in ~/.cache is written
    by every profiling job that probes the tools, two at once on one machine)."""
    write_json_atomic(path, data, indent=2, default=str)


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
            write_json(window.out_dir / "workload.json", window.meta())


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


