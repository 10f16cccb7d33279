"""The parts of bench/gpu_check (bench/gpu_check.py says what each measures and how they are run).

Each part is a `Part`: what it runs (`run(ctx, folder)`, its commands through `ctx.run`, which stops them
at the time limit), what it needs (`needs(ctx)`: why it cannot run here, or None) and its main figures
(`figures(ctx, folder)`, read back from the files it wrote), what it leaves out of the full measurement to
fit the check's 8 minutes (`cut`), and CPU-only work it starts in the background once `env` has run
(`early`: the workflow's corpus jobs). The estimates are seconds on one H100 with an empty compile cache,
from what the parts took there (`PARTS`), and on 2 CPU cores for --smoke; bench/gpu_check prints what each
part took.
"""

from __future__ import annotations

import csv
import json
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TINY = REPO / "tests" / "config" / "tiny.yaml"
GPU_OVERLAY = BENCH / "gpu_check.yaml"

# the GPU recipe's shapes (config/gpu.yaml), at which MFU and the refinement are measured
SHAPE = ["--layers", "12", "--context", "512", "--vocab", "8192", "--head-dim", "64", "--batch", "64"]
SMOKE_MFU = ["--cpu-smoke"]  # bench/gpu.py's own tiny CPU form: d 32 and 64, 2 layers, context 64, vocabulary 256


class OutOfTime(Exception):
    """The time limit came while a part's command ran (it was stopped)."""


class Failed(Exception):
    """A part's command exited non-zero."""


@dataclass
class Part:
    name: str
    what: str
    seconds: float        # estimated on one H100 with an empty compile cache
    smoke_seconds: float  # estimated at --smoke sizes on 2 CPU cores
    run: Callable         # run(ctx, folder): does the work through ctx.run, writes into its folder
    figures: Callable     # figures(ctx, folder) -> str: its main figures, from the files it wrote
    needs: Callable = lambda ctx: None  # needs(ctx) -> why it cannot run here, or None
    scale: Callable = lambda ctx: 1     # the estimate's multiple (the mfu part: one run per compile mode)
    cut: Callable = lambda ctx: ""      # cut(ctx) -> what it leaves out of the full measurement to fit, or ""
    early: Callable | None = None       # early(ctx): CPU-only work started in the background once `env` ran

    def estimate(self, ctx) -> float:
        return (self.smoke_seconds if ctx.smoke else self.seconds) * self.scale(ctx)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def write_csv(path: Path, rows: list[dict]) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys or ["none"])
        w.writeheader()
        w.writerows(rows)


def pct(value) -> str:
    return f"{float(value):.1%}" if value not in (None, "") else "n/a"


# --- env ---------------------------------------------------------------------------------------

def probe() -> dict:
    """This machine, as the other parts will see it (run in a process of its own: it opens a CUDA
    context, and Nsight Compute's probe profiles one kernel). Nothing here raises."""
    info: dict = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in ("transformers", "snakemake", "datasets", "tokenizers", "numpy", "triton"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = "not installed"
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    info["commit"] = commit or "unknown (not a git checkout)"
    try:
        import torch

        info.update(torch=torch.__version__, cuda_build=torch.version.cuda or "none", cuda=torch.cuda.is_available())
        if info["cuda"]:
            props = torch.cuda.get_device_properties(0)
            info.update(device=props.name, devices=torch.cuda.device_count(),
                        memory_gib=round(props.total_memory / 2**30, 1), capability=f"{props.major}.{props.minor}")
    except Exception as err:  # a torch that does not import is the finding
        info.update(torch=f"does not import: {err}", cuda=False)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        info["driver"] = smi[0] if smi else "unknown"
    except (OSError, subprocess.SubprocessError):
        info["driver"] = "no nvidia-smi"
    try:
        from growlm.devices import peak_flops

        peak = peak_flops("cuda" if info.get("cuda") else "cpu", None)
        info["peak_tflops"] = round(peak / 1e12, 1) if peak else "unknown"
        from growlm.profiling.tools import detect_tools

        ncu = detect_tools(probe="ncu")["ncu"]
        info["ncu"] = {k: ncu.get(k) for k in ("found", "works", "path", "version", "reason")}
    except Exception as err:
        info["ncu"] = {"found": False, "works": False, "reason": f"could not look for it: {err}"}
    return info


def run_env(ctx, folder: Path) -> None:
    found = folder / "env.json"
    ctx.run([ctx.python, BENCH / "gpu_check.py", "--probe", found], log=folder / "log.txt")
    ctx.found = json.loads(found.read_text())
    flat = [{"key": k, "value": json.dumps(v) if isinstance(v, dict) else v} for k, v in ctx.found.items()]
    write_csv(folder / "env.csv", flat)


def env_figures(ctx, folder: Path) -> str:
    f = ctx.found
    card = (f"{f.get('device')} ({f.get('memory_gib')} GiB, {f.get('devices')} device(s)), driver {f.get('driver')}"
            if f.get("cuda") else "no CUDA device")
    ncu = f.get("ncu", {})
    return (f"{card}; torch {f.get('torch')} (CUDA {f.get('cuda_build')}), Python {f.get('python')}, "
            f"commit {f.get('commit')}; ncu: {'works' if ncu.get('works') else ncu.get('reason')}")


def needs_cuda(why: str):
    return lambda ctx: None if ctx.found.get("cuda") else f"no CUDA device ({why})"


def cuda_or_smoke(why: str):
    return lambda ctx: None if ctx.smoke or ctx.found.get("cuda") else f"no CUDA device ({why})"


# --- mfu ---------------------------------------------------------------------------------------

def mfu_modes(ctx) -> list[str]:
    return ["eager"] if ctx.smoke else ctx.options["mfu_modes"]


def mfu_sizes(ctx) -> list[str]:
    """The widths the mfu part measures: d 768 by default (RESULTS 4's d 1024 row is `--mfu-sizes 768,1024`,
    about 60 s more a mode: more than the check's margin)."""
    return ["32", "64"] if ctx.smoke else ctx.options.get("mfu_sizes", ["768"])


def mfu_cut(ctx) -> str:
    left = [d for d in ("768", "1024") if d not in mfu_sizes(ctx)]
    return "" if ctx.smoke or not left else (f"cut to fit: d {', '.join(left)} (--mfu-sizes "
                                             f"{','.join(sorted({*mfu_sizes(ctx), *left}, key=int))} adds it)")


def run_mfu(ctx, folder: Path) -> None:
    """One process per compile mode; a mode that fails leaves the next one its turn."""
    failed = []
    for mode in mfu_modes(ctx):
        args = SMOKE_MFU if ctx.smoke else ["--device", "cuda", "--sizes", ",".join(mfu_sizes(ctx)), *SHAPE,
                                            "--warm", "5", "--steps", "20", "--compile", mode]
        try:
            ctx.run([ctx.python, BENCH / "gpu.py", *args, "--out", folder / f"mfu_{mode}.csv"], log=folder / "log.txt")
        except Failed as err:
            failed.append(f"{mode}: {err}")
    if failed:
        raise Failed("; ".join(failed))


def mfu_figures(ctx, folder: Path) -> str:
    out = []
    for mode in mfu_modes(ctx):
        if not (folder / f"mfu_{mode}.csv").is_file():
            continue
        for r in read_csv(folder / f"mfu_{mode}.csv"):
            if r["mfu"]:
                out.append(f"{mode} d{r['d']}: MFU {pct(r['mfu'])}, reference {pct(r['ref_mfu'])} "
                           f"(x{r['ratio_to_reference']})")
            else:
                out.append(f"{mode} d{r['d']}: {float(r['tokens_per_s']):,.0f} tok/s, x{r['ratio_to_reference']} "
                           f"the reference's")
    return "; ".join(out)


# --- refine ------------------------------------------------------------------------------------

def run_refine(ctx, folder: Path) -> None:
    args = ["--quick"] if ctx.smoke else ["--device", "cuda", "--d", "768", *SHAPE, "--ramp", "10", "--after", "8",
                                          "--rounds", "1", "--compile", "all"]
    ctx.run([ctx.python, BENCH / "refine_speed.py", *args, "--out", folder / "refine_speed.csv"],
            log=folder / "log.txt")


def refine_figures(ctx, folder: Path) -> str:
    rows = read_csv(folder / "refine_speed.csv")
    out = []
    for mode in dict.fromkeys(r["compile"] for r in rows):
        mine = [r for r in rows if r["compile"] == mode]
        out.append(f"{mode}: during the ramp {min(float(r['during']) for r in mine):.2f}, after "
                   f"{min(float(r['after']) for r in mine):.2f} of M_0 (slowest arm)")
    even = [f"{r['arm']} {float(r['break_even_ramp_steps']):.0f}" for r in rows if r.get("break_even_ramp_steps")]
    if even:
        out.append("compile_ramps pays from a ramp of " + ", ".join(even) + " steps")
    return "; ".join(out)


# --- workflow ----------------------------------------------------------------------------------

def workflow_overlay(ctx) -> Path:
    return TINY if ctx.smoke else GPU_OVERLAY


def experiment_of(overlay: Path) -> str:
    import yaml

    return yaml.safe_load(overlay.read_text())["experiment"]


# what the workflow part leaves out of the GPU recipe so that the whole check fits its 8 minutes (the summary
# says so beside the part); the smoke run is the tiny experiment, whole
WORKFLOW_CUT = ("cut to fit: the concat arm (the refine part measures its step), 18 of the 27 bundled books, the "
                "member's Nsight Compute profile and Nsight Systems, the report; budgets of 1M and 2M tokens")


def workflow_targets(ctx) -> list[str]:
    """What the workflow part asks Snakemake for: the comparison and Nsight Compute's profiles of M_0 and M'_1
    (where ncu works); the smoke run's tiny experiment, everything (`all`)."""
    if ctx.smoke:
        return []
    results = f"results/{experiment_of(GPU_OVERLAY)}"
    ncu = ctx.found.get("ncu", {}).get("works")
    return [f"{results}/eval/comparison.csv", *(f"{results}/profile/ncu/{kind}/summary.csv" for kind in
                                                 (("baseline", "refine") if ncu else ()))]


def workflow_folder(ctx, *, fresh: bool) -> Path:
    """The run's folder (links to workflow/, config/, profiles/), as a user's; `fresh`: emptied first."""
    wd = ctx.options.get("workflow_dir") or ctx.work / "workflow"
    if fresh and not ctx.options.get("workflow_dir"):
        shutil.rmtree(wd, ignore_errors=True)  # a fresh run: its wall times are a first run's
    wd.mkdir(parents=True, exist_ok=True)
    for name in ("workflow", "config", "profiles"):
        if not (wd / name).exists():
            (wd / name).symlink_to(REPO / name)
    return wd


def workflow_command(ctx, wd: Path, *extra: str) -> list:
    overlay = workflow_overlay(ctx)
    tools = wd / "gpu_check_tools.yaml"  # Nsight Compute's profile jobs only where it works
    tools.write_text("profile: {tools: [ncu]}\n" if ctx.found.get("ncu", {}).get("works") else "profile: {tools: []}\n")
    ctx.options["workflow_results"] = wd / "results" / experiment_of(overlay)
    return [ctx.python, "-m", "snakemake", *extra, "--profile", "profiles/gpu", "--configfile", "config/config.yaml",
            overlay, tools]  # targets first: words after --configfile would be read as config files


def start_corpus(ctx) -> None:
    """The workflow's corpus jobs (books to token files: CPU only) in the background while the GPU parts before
    the workflow part run, so that its own time starts at the members' training."""
    wd = workflow_folder(ctx, fresh=True)
    cmd = workflow_command(ctx, wd, "--until", "encode_split")
    log = open(ctx.work / "workflow_corpus.log", "w")
    log.write("$ " + " ".join(str(c) for c in cmd) + "\n")
    log.flush()
    ctx.options["corpus"] = (subprocess.Popen([str(c) for c in cmd], cwd=wd, env=ctx.env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True), log, time.monotonic())


def wait_for_corpus(ctx, folder: Path) -> None:
    """The corpus jobs started early (`start_corpus`), ended: its log joins the part's."""
    proc, log, t0 = ctx.options.pop("corpus")
    try:
        code = proc.wait(timeout=max(ctx.left() - 10, 0.1))
    except subprocess.TimeoutExpired:
        stop_early(proc)
        raise OutOfTime from None
    finally:
        log.close()
        text = (ctx.work / "workflow_corpus.log").read_text(errors="replace")
        (folder / "log.txt").write_text(text + f"[corpus jobs started early: {time.monotonic() - t0:.0f} s]\n")
    if code != 0:
        raise Failed(f"the corpus jobs failed (exit {code}): see {folder / 'log.txt'}")


def stop_early(proc: subprocess.Popen) -> None:
    import os
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=10)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            if proc.poll() is not None:
                return


def stop_leftovers(ctx) -> None:
    """Stop early work whose part did not run."""
    if "corpus" in ctx.options:
        proc, log, _ = ctx.options.pop("corpus")
        stop_early(proc)
        log.close()


def run_workflow(ctx, folder: Path) -> None:
    """The workflow in a folder of its own, as a user runs it: its corpus jobs started early (`start_corpus`),
    then to the comparison and the profiles (`workflow_targets`)."""
    early = "corpus" in ctx.options
    if early:
        wait_for_corpus(ctx, folder)
    wd = workflow_folder(ctx, fresh=not early)
    cmd = workflow_command(ctx, wd, *workflow_targets(ctx))
    results = ctx.options["workflow_results"]
    t0, result = time.monotonic(), "stopped at the time limit"
    try:
        ctx.run(cmd, log=folder / "log.txt", cwd=wd, extra_env={"TORCH_LOGS": "recompiles"})
        result = "finished"
    except Exception as err:
        result = f"{type(err).__name__}: {err}"
        raise
    finally:
        collect_workflow(results, folder, {"command": " ".join(str(c) for c in cmd), "folder": str(wd),
                                           "wall_s": round(time.monotonic() - t0, 1), "result": result})


def collect_workflow(results: Path, folder: Path, run: dict) -> None:
    """What the run left, as CSV: every job's wall time and recompilations, every training job's figures,
    the comparison. Also after a failed or stopped run (what finished is there)."""
    rows = []
    for tsv in sorted((results / "benchmarks").rglob("*.tsv")):
        rel = tsv.relative_to(results / "benchmarks")
        bench = read_csv_tsv(tsv)
        log = results / "logs" / rel.with_suffix(".log")
        text = log.read_text(errors="replace") if log.is_file() else ""
        rows.append({"rule": rel.parts[0] if len(rel.parts) > 1 else rel.stem,
                     "job": str(rel.with_suffix(""))[len(rel.parts[0]) + 1:] if len(rel.parts) > 1 else "",
                     "seconds": float(bench["s"]), "max_rss_mb": bench.get("max_rss", ""),
                     "cpu_s": bench.get("cpu_time", ""), "recompiles": text.count("Recompiling function")})
    write_csv(folder / "rules.csv", rows)
    totals = {}
    for r in rows:
        t = totals.setdefault(r["rule"], {"rule": r["rule"], "jobs": 0, "total_s": 0.0, "max_s": 0.0, "recompiles": 0})
        t["jobs"] += 1
        t["total_s"] = round(t["total_s"] + r["seconds"], 2)
        t["max_s"] = max(t["max_s"], r["seconds"])
        t["recompiles"] += r["recompiles"]
    write_csv(folder / "rule_totals.csv", sorted(totals.values(), key=lambda t: -t["total_s"]))
    training = []
    for meta in sorted((results / "models").rglob("growlm.json")):
        summary = json.loads(meta.read_text()).get("train") or {}
        if not summary:
            continue
        cfg, fpt = summary.get("config", {}), summary.get("flops_per_token") or 0
        rate = summary.get("model_flops_per_s")
        training.append({"model": str(meta.parent.relative_to(results / "models")), "device": cfg.get("device"),
                         "steps": summary.get("steps"), "tokens": summary.get("tokens"),
                         "wall_s": round(summary.get("wall_s", 0), 1), "compile_s": round(summary.get("compile_s", 0), 1),
                         "tokens_per_s": round(rate / fpt) if rate and fpt else "",
                         "mfu": (summary.get("gpu_settings") or {}).get("mfu", ""),
                         "micro_batch": cfg.get("micro_batch_size"), "strategy": cfg.get("strategy"),
                         "compile": cfg.get("compile")})
    write_csv(folder / "training.csv", training)
    comparison = results / "eval" / "comparison.csv"
    if comparison.is_file():
        shutil.copy(comparison, folder / "comparison.csv")
    write_csv(folder / "run.csv", [{**run, "jobs": len(rows), "recompiles": sum(r["recompiles"] for r in rows)}])


def read_csv_tsv(path: Path) -> dict:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))[-1]


def workflow_figures(ctx, folder: Path) -> str:
    run = read_csv(folder / "run.csv")[0]
    jobs = read_csv(folder / "rules.csv")
    out = [f"{run['jobs']} jobs ({sum(float(j['seconds']) for j in jobs):.0f} s of job time, "
           f"{run['recompiles']} recompilations); Snakemake ran {float(run['wall_s']):.0f} s ({run['result']})"]
    totals = read_csv(folder / "rule_totals.csv")
    if totals:
        out.append("longest rules " + ", ".join(f"{t['rule']} {float(t['total_s']):.0f} s" for t in totals[:3]))
    if (folder / "comparison.csv").is_file():
        for r in read_csv(folder / "comparison.csv"):
            out.append(f"{r['method']}: cost ratio {float(r['cost_ratio']):.2f}" if r["cost_ratio"] else
                       f"{r['method']}: M_0's loss not reached ({float(r['m1_final_val_loss']):.3f} against "
                       f"{float(r['m0_final_val_loss']):.3f})")
    return "; ".join(out)


# --- ncu ---------------------------------------------------------------------------------------

def ncu_needs(ctx) -> str | None:
    ncu = ctx.found.get("ncu", {})
    if not ncu.get("works"):
        return f"{ncu.get('reason') or 'ncu not found'} (so the workflow has no profile jobs)"
    if "workflow" not in ctx.ran:
        return "the workflow part did not run to the end"
    return None


def run_ncu(ctx, folder: Path) -> None:
    """The Nsight Compute tables of the workflow's profile jobs; each must have been made by ncu itself
    (a profile job falls back to torch.profiler when ncu fails, and says why)."""
    profiled = ctx.options["workflow_results"] / "profile" / "ncu"
    kinds = sorted(p for p in profiled.iterdir() if p.is_dir()) if profiled.is_dir() else []
    if not kinds:
        raise RuntimeError(f"no profile tables in {profiled}")
    fell_back = []
    for kind in kinds:
        for f in kind.iterdir():
            if f.suffix in (".csv", ".json") and f.is_file():
                (folder / kind.name).mkdir(exist_ok=True)
                shutil.copy(f, folder / kind.name / f.name)
        summary = read_csv(kind / "summary.csv")[0] if (kind / "summary.csv").is_file() else {}
        if summary.get("profiler") != "ncu":
            fell_back.append(f"{kind.name}: {summary.get('profiler', 'no summary')} ({summary.get('notes', '')})")
    if fell_back:
        raise RuntimeError("not measured by ncu: " + "; ".join(fell_back))


def ncu_figures(ctx, folder: Path) -> str:
    kinds = sorted(p.name for p in folder.iterdir() if p.is_dir())
    return f"Nsight Compute tables of {', '.join(kinds)}" if kinds else ""


# --- memory ------------------------------------------------------------------------------------

def run_memory(ctx, folder: Path) -> None:
    ladder = max(10.0, min(ctx.options["memory_ladder_s"], ctx.left() - 40))
    ctx.run([ctx.python, BENCH / "memory.py", "--gpu", "--out", folder / "memory_gpu.csv", "--time-budget",
             f"{ladder:.0f}"], log=folder / "log.txt")


def memory_figures(ctx, folder: Path) -> str:
    text = (folder / "log.txt").read_text(errors="replace")
    found = re.findall(r"^(largest naive: .*|params_ratio=.*)$", text, flags=re.M)
    return "; ".join(found) if found else f"{len(read_csv(folder / 'memory_gpu.csv'))} sizes tried"


# Estimates (seconds) from one H100 (bench/results/gpu_check_h100/, 2026-11-27, an empty compile cache): env 13-18 s,
# mfu 123 s for two widths (so 65 s for one, `mfu_sizes`), refine 149 s, memory 56 s with a 30 s ladder (20 s now).
# The workflow part's is the critical path of its cut DAG (bench/gpu_check.yaml) in that run's job times
# (workflow_rules.csv, measured at twice the cut budgets, so an upper bound on its training): M_0 (51 s; the
# members, 28 and 47 s, beside it, three GPU jobs at a time), grow (19 s), the refinement (38 s; the two profiles,
# 25-31 s, beside it), M_1's evaluation (14 s), the comparison (3 s): 125 s, plus Snakemake's own start, 130 s
# (tests/test_gpu_check.py recomputes it from the CSV). The corpus jobs are done while mfu, refine and memory run.
# The five add up to 403 s of the 480: a margin of 77 s. The workflow's is the least sure of them (its jobs were
# measured one GPU job at a time, and here three share the GPU), so it runs last, with ncu, which reads its
# tables: the margin is then its own, and it may take 1.5 times its estimate with every part still run.
PARTS = [
    Part("env", "the card, driver, torch, CUDA and Nsight Compute", 18, 15, run_env, env_figures),
    Part("mfu", "MFU of growlm's step (d 768; --mfu-sizes) beside the reference loop compiled the same way", 65, 40,
         run_mfu, mfu_figures, cuda_or_smoke("bench/gpu.py measures MFU on a GPU"),
         scale=lambda ctx: len(mfu_modes(ctx)) * (1 if ctx.smoke else len(mfu_sizes(ctx))), cut=mfu_cut),
    Part("refine", "bench/refine_speed.py at d 768: msg, concat, V-cycle against M_0, three compile modes", 150, 60,
         run_refine, refine_figures, cuda_or_smoke("sized for a GPU")),
    Part("memory", "bench/memory.py --gpu: the planner under an 8 GiB cap, its throughput against naive", 40, 0,
         run_memory, memory_figures, needs_cuda("bench/memory.py --gpu caps the CUDA allocator")),
    Part("workflow", "the workflow with profiles/gpu on bench/gpu_check.yaml (tiny.yaml with --smoke)", 130, 120,
         run_workflow, workflow_figures, cuda_or_smoke("sized for a GPU; --smoke runs the tiny experiment on the CPU"),
         cut=lambda ctx: "" if ctx.smoke else WORKFLOW_CUT, early=start_corpus),
    Part("ncu", "the Nsight Compute tables of the workflow's profile jobs (M_0, M'_1)", 0, 0, run_ncu, ncu_figures,
         ncu_needs),
]
