"""What an interrupted run left behind, and the one command that continues it.

Killing Snakemake (kill -9, a closed terminal, a lost login node) leaves its lock in
`.snakemake/locks/`; the next run then stops with a LockException. Its jobs do not run on as
orphans: every job stops when its Snakemake dies, a training job after writing a checkpoint, or at
once if it finds its Snakemake gone when it starts (`growlm.errors.stop_with_parent`), and every
process a job started ends before the job does (`growlm.launch`). The workflow profile sets
`rerun-incomplete`, so the job's
half-written outputs are simply made again, resuming from that checkpoint. What is left is the lock:
`interrupted_run_notice`, called while the Snakefile is parsed (before Snakemake checks the lock),
sees a lock that no running Snakemake holds and prints the one command that continues the run.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from growlm.hints import snakemake_program


def _snakemake_running_in(workdir: Path) -> bool:
    """Whether another Snakemake process on this machine works in `workdir` (Linux's /proc)."""
    me = {os.getpid(), os.getppid()}
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) in me:
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "snakemake" not in cmdline:
                continue
            if Path(os.readlink(proc / "cwd")).resolve() == workdir:
                return True
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return False


def interrupted_run_notice(workdir: str | Path, argv: list[str]) -> str | None:
    """A message with the command that continues an interrupted run, if `workdir` holds a lock that no
    running Snakemake on this machine holds; None otherwise (and on systems without /proc)."""
    workdir = Path(workdir).resolve()
    if not list((workdir / ".snakemake" / "locks").glob("*.lock")) or not Path("/proc/self").exists():
        return None
    if any(a in ("--unlock", "--executor=slurm-jobstep") for a in argv) or "slurm-jobstep" in argv:
        return None
    if _snakemake_running_in(workdir):
        return None
    prog = snakemake_program(argv)
    words = argv[1:]
    options = words.index("--") if "--" in words else len(words)  # after a `--`, a flag would be a target
    again = " ".join([prog, *map(shlex.quote, words)])
    unlock = " ".join([prog, *map(shlex.quote, [*words[:options], "--unlock", *words[options:]])])
    return ("growlm: a previous run in this folder was interrupted and left Snakemake's lock (no Snakemake is "
            "running here now). Its jobs stopped with it, a training job at a checkpoint if it had begun; this command "
            "continues the run:\n"
            f"    {unlock} && {again}")  # the same folder, Snakefile and config: --unlock of this run
