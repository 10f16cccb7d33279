"""Finding Nsight Systems (nsys) and Nsight Compute (ncu), and whether they work on this machine.

`detect_tools()` looks for each tool ($GROWLM_NSYS / $GROWLM_NCU, the PATH, the usual install
folders), asks its version and, when asked to, probes it with a tiny real profile: nsys must write a
report that `nsys stats` reads; ncu must read hardware counters of a CUDA kernel. A probe that runs
past its timeout counts as not working (a broken nsys can hang). Results are cached in-process and in
~/.cache/growlm/profile_tools.json, keyed by the binary, its mtime, the host, the Python and
CUDA_VISIBLE_DEVICES. Nothing here raises: a missing or broken tool is a finding, not an error.
"""

from __future__ import annotations

import contextlib
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

from growlm import processes
from growlm.profiling.ranges import write_json

# Strings in a tool's output that mean it could not measure anything.
NCU_FAILURE_MARKERS = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "No kernels were profiled",
                       "==ERROR== Failed", "==ERROR== Unknown", "==ERROR== Profiling failed",
                       "Failed to find metric", "Failed to profile", "not supported on this device")

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


def run_command(cmd, *, timeout: float, env=None, cwd=None) -> tuple[int, str]:
    """Run a command (own process group so a timeout kills its children); (rc, stdout+stderr). It is one of
    the job's processes (`growlm.processes.start`): it holds the job's GPUs and stops with the job, and the job
    waits for what it started (the profiled workload) before it goes on."""
    try:
        proc = processes.start(cmd, env=env, cwd=cwd, new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    except OSError as err:
        return 127, f"{err}"
    with processes.stopping(proc, group=True, grace_s=30):
        try:
            out, _ = proc.communicate(timeout=timeout)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return 124, (out or "") + f"\n[growlm] timed out after {timeout:.0f} s"


def last_line(text: str) -> str:
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
        rc, out = run_command([path, "profile", f"--trace={trace}", "--sample=none", "--cpuctxsw=none",
                        "-o", f"{tmp}/probe", "--force-overwrite=true", sys.executable, "-c", snippet],
                       timeout=timeout)
        rep = Path(tmp, "probe.nsys-rep")
        if not rep.exists():
            qd = list(Path(tmp).glob("*.qdstrm"))
            why = ("wrote a .qdstrm but no .nsys-rep (QdstrmImporter missing?)" if qd
                   else f"no report (rc={rc}): {last_line(out)}")
            return False, why
        # report names of Nsight Systems 2023+, then the older ones
        for report in (("cuda_api_sum", "cudaapisum") if cuda else ("osrt_sum", "osrtsum")):
            rc, out = run_command([path, "stats", "--report", report, "--format", "csv",
                            "--force-export=true", "--output", f"{tmp}/probe", str(rep)],
                           timeout=timeout)
            if rc == 0 and list(Path(tmp).glob("probe_*.csv")):
                return True, "nsys profile + nsys stats work"
        return False, f"nsys stats failed (rc={rc}): {last_line(out)}"


def _probe_ncu(path: str, cuda: bool, timeout: float) -> tuple[bool, str]:
    if not cuda:
        return False, "no CUDA device: ncu has nothing to profile"
    snippet = "import torch; x=torch.ones(1<<20, device='cuda'); (x*2).sum().item()"
    rc, out = run_command([path, "--target-processes", "all", "--launch-count", "1", "--section",
                    "SpeedOfLight", "--csv", sys.executable, "-c", snippet], timeout=timeout)
    for marker in NCU_FAILURE_MARKERS:
        if marker in out:
            return False, f"ncu cannot read counters: {marker}"
    if rc != 0:
        return False, f"ncu probe failed (rc={rc}): {last_line(out)}"
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
            rc, out = run_command([path, "--version"], timeout=30)
            if rc != 0:
                entry.update(path=path, reason=f"{path} --version failed (rc={rc})")
                continue
            entry.update(found=True, path=path, version=last_line(out), works=None,
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
            write_json(_cache_file(), disk)
    return result


