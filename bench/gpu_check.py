"""Every GPU figure of bench/RESULTS.md (sections 3 and 4) from one command of minutes, without a network.

    bench/gpu_check                         # every part on the GPU, at most --minutes (8) in all
    bench/gpu_check --out DIR --minutes 12 --mfu-modes default,reduce-overhead
    bench/gpu_check --only workflow         # one part again (--skip leaves parts out)
    bench/gpu_check --smoke                 # the same code on the CPU at tiny sizes (tests/test_gpu_check.py)

`bench/gpu_check` runs this file with the project's `.venv` where there is one, else with `python3` (a
machine whose packages were unpacked from a wheel folder onto PYTHONPATH). The parts, in this order,
each in a process of its own, so that one that fails, runs out of memory or loses its CUDA context
leaves the others their GPU:

- `env`: the card, its driver, torch, CUDA, Python and the pinned packages' versions, the commit, and
  whether Nsight Compute works (`growlm.profiling.tools`): `env.csv`.
- `mfu`: `bench/gpu.py` at the GPU recipe's shapes (d 768, and 1024 with `--mfu-sizes 768,1024`; 12
  layers, context 512, vocabulary 8192, head size 64, batch 64), torch.compile'd, beside the nanoGPT-style reference loop compiled the
  same way in the same process, with the bf16 matmul ceiling: `mfu/mfu_<mode>.csv`.
- `refine`: `bench/refine_speed.py` at d 768 of the same shape: msg, concat and the V-cycle against M_0,
  eager, compiled with the ramps eager and with them compiled, and the ramp length from which
  `train.compile_ramps` pays: `refine/refine_speed.csv`.
- `memory`: `bench/memory.py --gpu`: the largest model that trains under an 8 GiB cap naively and with
  the planner (its ladder held to `--memory-ladder-s`), and the planner's throughput against naive:
  `memory/memory_gpu.csv`.
- `workflow`: the workflow itself, `snakemake --profile profiles/gpu --configfile config/config.yaml
  bench/gpu_check.yaml` (nine bundled readers; members 384 x 6, M_0 and M_1 768 x 12, msg; three GPU jobs
  at a time) in a folder of its own, to the comparison and the Nsight Compute profiles of M_0 and M'_1,
  no network (HF_HUB_OFFLINE), `TORCH_LOGS=recompiles`; its corpus jobs (CPU only) run in the background
  while mfu, refine and memory use the GPU. Every job's wall time (`workflow/rules.csv`, per rule
  `rule_totals.csv`), every training job's tokens/s, MFU, compile seconds and recompilations
  (`training.csv`), the comparison (`comparison.csv`). It is cut from the GPU recipe to fit the 8 minutes
  (the concat arm, most books, the member's profile, the report, the budgets); `summary.csv` says so.
- `ncu`: the Nsight Compute tables of that run's profile jobs (M_0, M'_1): `ncu/<kind>/`.
  Where ncu is missing or cannot read counters the workflow runs without profile jobs.

A part whose tool is missing (no CUDA device, no ncu) is skipped with one line saying why; one that would
not fit in the time left (its estimate, `gpu_check_parts.PARTS`, from what the parts took on one H100; the
five add up to 403 s of the default 480; the workflow's, the least sure, comes last but for ncu, so the margin is
its own) is skipped and named; one that fails or is stopped at the time limit keeps the files it wrote, and the next part runs.
Each part writes its folder when it ends, and `summary.csv` (every part, whether it ran, its seconds, what
it cut to fit and its main figures) is rewritten after each; the table is printed at the end. The parts share one compile
cache (`--work`/torchinductor, or $TORCHINDUCTOR_CACHE_DIR), as the workflow's jobs share theirs, so
M_0's graph compiled by `mfu` is loaded, not compiled, by `refine` and the workflow's jobs.
`--smoke` runs env, mfu, refine and the workflow on the CPU at tiny sizes (the workflow on
tests/config/tiny.yaml; `--workflow-dir` continues a run folder that holds one), without compiling.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflow" / "scripts"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_parts as parts  # noqa: E402
from gpu_check_parts import Failed, OutOfTime  # noqa: E402


@dataclass
class Context:
    out: Path
    work: Path
    smoke: bool
    deadline: float
    env: dict
    python: str = sys.executable
    options: dict = field(default_factory=dict)
    found: dict = field(default_factory=dict)  # what `env` found (cuda, ncu, versions)
    ran: set = field(default_factory=set)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, cmd: list, *, log: Path, cwd: Path = REPO, extra_env: dict | None = None) -> None:
        """Run `cmd` (its output appended to `log`) until it ends or the time limit; raise Failed on a
        non-zero exit, OutOfTime when stopped (SIGTERM to its process group GRACE seconds before the limit,
        so that Snakemake stops its jobs, SIGKILL at the limit)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**self.env, **(extra_env or {})}
        with open(log, "a") as fh:
            fh.write("$ " + " ".join(str(c) for c in cmd) + "\n")
            fh.flush()
            proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=max(self.left() - GRACE, 0.1))
            except subprocess.TimeoutExpired:
                stop(proc)
                raise OutOfTime from None
            except KeyboardInterrupt:  # its own session does not see the Ctrl-C: stop it, then stop here
                stop(proc)
                raise
        if code != 0:
            raise Failed(f"exit {code}: {last_lines(log, 1)}")


GRACE = 10  # seconds between SIGTERM and SIGKILL


def stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, GRACE), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            if proc.poll() is not None:
                return


def last_lines(path: Path, n: int) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-300:]


@dataclass
class Row:
    part: str
    status: str
    ran: bool = False
    seconds: float = 0.0
    estimate_s: float = 0.0
    figures: str = ""
    folder: str = ""
    cut: str = ""  # what the part leaves out of the full measurement to fit the time limit


def run_parts(selected: list, ctx: Context, *, asked: set[str] | None = None, say=print) -> list[Row]:
    """Run the parts in order within the time limit; return one row per part (ran, skipped, failed,
    stopped); `summary.csv` in ctx.out is rewritten after each part."""
    rows = [Row(p.name, "not reached") for p in selected]
    for i, part in enumerate(selected):
        row, folder = rows[i], ctx.out / part.name
        row.estimate_s = part.estimate(ctx)
        row.cut = part.cut(ctx)
        why = part.needs(ctx)
        if (asked is not None and part.name not in asked or why or row.estimate_s > ctx.left()) and part.early:
            parts.stop_leftovers(ctx)  # the early work of a part that will not run
        if asked is not None and part.name not in asked:
            row.status = "not asked for (--only / --skip)"
        elif why:
            row.status = f"skipped: {why}"
        elif row.estimate_s > ctx.left():
            row.status = (f"skipped: needs about {row.estimate_s:.0f} s, {max(ctx.left(), 0):.0f} s left of the "
                          f"time limit")
        else:
            say(f"[{part.name}] {part.what} (about {row.estimate_s:.0f} s; {ctx.left():.0f} s left)")
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            t0 = time.monotonic()
            try:
                part.run(ctx, folder)
                row.status, row.ran = "ran", True
                ctx.ran.add(part.name)
            except OutOfTime:
                row.status = "stopped at the time limit (the files it wrote are kept)"
            except Failed as err:
                row.status = f"failed: {err}"
            except Exception as err:  # a part's own check, or a bug in it: reported, the next part runs
                row.status = f"failed: {type(err).__name__}: {err}"[:300]
            row.seconds = round(time.monotonic() - t0, 1)
            try:
                row.figures = part.figures(ctx, folder)
            except Exception as err:  # what it wrote is incomplete: say so, keep going
                row.figures = f"(no figures: {type(err).__name__}: {err})"[:200]
            row.folder = str(folder)
            say(f"[{part.name}] {row.status} in {row.seconds:.0f} s: {row.figures}")
        if i == 0:  # `env` has run: CPU-only work of the parts that will run starts now, beside the GPU parts
            for later in selected[1:]:
                if later.early and (asked is None or later.name in asked) and not later.needs(ctx):
                    later.early(ctx)
        write_summary(ctx.out, rows)
    parts.stop_leftovers(ctx)  # early work of a part that did not run (skipped, or the time was up)
    return rows


def write_summary(out: Path, rows: list[Row]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["part", "status", "ran", "seconds", "estimate_s", "cut", "figures", "folder"])
        for r in rows:
            w.writerow([r.part, r.status, "yes" if r.ran else "no", r.seconds, r.estimate_s, r.cut, r.figures,
                        r.folder])


def table(rows: list[Row]) -> str:
    lines = [f"{'part':<9} {'ran':<4} {'seconds':>7}  status / figures"]
    for r in rows:
        lines.append(f"{r.part:<9} {'yes' if r.ran else 'no':<4} {r.seconds:>7.0f}  {r.status}")
        for extra in (r.cut, r.figures):
            if extra:
                lines.append(f"{'':<23}{extra}")
    return "\n".join(lines)


def environment(work: Path) -> dict:
    """The parts' environment: growlm on the path, no network, one compile cache for all of them."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "torchinductor"))
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "run_gpu_check" / "figures",
                   help="folder of the CSV folders and summary.csv")
    p.add_argument("--work", type=Path, default=REPO / "bench" / "run_gpu_check" / "work",
                   help="folder of the workflow run (models, logs) and the compile cache")
    p.add_argument("--minutes", type=float, default=8.0, help="time limit for all parts together")
    p.add_argument("--smoke", action="store_true", help="on the CPU at tiny sizes, without compiling")
    p.add_argument("--only", default="", help="comma-separated parts to run (env always runs)")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out")
    p.add_argument("--mfu-modes", default="default", help="torch.compile modes of the mfu part, comma-separated")
    p.add_argument("--mfu-sizes", default="768",
                   help="widths d of the mfu part, comma-separated (768,1024: RESULTS 4's rows, about 60 s more)")
    p.add_argument("--workflow-dir", type=Path, default=None,
                   help="run the workflow in this folder, continuing what is there (default: a fresh "
                        "folder under --work)")
    p.add_argument("--memory-ladder-s", type=float, default=20.0,
                   help="seconds the memory part's planner ladder may take (bench/memory.py --time-budget)")
    p.add_argument("--probe", type=Path, help=argparse.SUPPRESS)  # the env part's own process: where to write  # the env part's own process
    args = p.parse_args(argv)
    if args.probe:
        args.probe.write_text(json.dumps(parts.probe(), indent=1))
        return 0
    t_start = time.monotonic()
    every = parts.PARTS
    names = [q.name for q in every]
    for opt in (args.only, args.skip):
        unknown = [n for n in opt.split(",") if n and n not in names]
        if unknown:
            p.error(f"unknown part(s) {', '.join(unknown)}: the parts are {', '.join(names)}")
    widths = [d for d in args.mfu_sizes.split(",") if d]
    if not widths or not all(d.isdigit() and int(d) > 0 for d in widths):
        p.error(f"--mfu-sizes {args.mfu_sizes!r}: widths d are positive integers, comma-separated (768,1024)")
    asked = set(args.only.split(",")) | {"env"} if args.only else set(names)
    asked -= set(args.skip.split(",")) - {"env"}
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(out=args.out.resolve(), work=work, smoke=args.smoke, deadline=t_start + 60 * args.minutes,
                  env=environment(work),
                  options={"mfu_modes": [m for m in args.mfu_modes.split(",") if m],
                           "mfu_sizes": widths,
                           "workflow_dir": args.workflow_dir.resolve() if args.workflow_dir else None,
                           "memory_ladder_s": args.memory_ladder_s})
    ctx.out.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: {'smoke (CPU, tiny sizes)' if args.smoke else 'GPU'}, time limit {args.minutes:g} minutes; "
          f"figures in {ctx.out}, work in {work}", flush=True)
    rows = run_parts(every, ctx, asked=asked, say=lambda s: print(s, flush=True))
    print("\n" + table(rows), flush=True)
    took = time.monotonic() - t_start
    groups = {k: ",".join(r.part for r in rows if test(r)) for k, test in (
        ("ran", lambda r: r.ran), ("skipped", lambda r: r.status.startswith(("skipped", "not asked"))),
        ("failed", lambda r: r.status.startswith(("failed", "stopped"))))}
    print(f"gpu_check ran={groups['ran']} skipped={groups['skipped']} failed={groups['failed']} "
          f"seconds={took:.0f} out={ctx.out}", flush=True)
    return 1 if groups["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
