"""Where the suite's time goes: each test's seconds, grouped by file and by what the test runs.

Record a run (every process a test or its fixtures start, by kind), then group its `--durations=0`:

    GROWLM_TEST_COSTS=/tmp/kinds .venv/bin/python -m pytest -ra --durations=0 -p no:cacheprovider | tee /tmp/durations.txt
    .venv/bin/python tests/suite_costs.py /tmp/durations.txt /tmp/kinds

A test's kind is the heaviest thing it (or a fixture it set up) started:

- `workflow`: a Snakemake run that runs jobs (each job a new interpreter that imports torch);
- `waits`: it waited for a shared run (tests/conftest.py's `finished_run`) that the other worker was making;
- `dry run`: Snakemake started for a plan, a lint or a refusal before any job (no job runs);
- `process`: another interpreter or command (a training job, torchrun, a benchmark, Chromium, SLURM);
- `function`: nothing started, everything in the test's own process.

A shared run (tests/conftest.py's `finished_run`: `tiny_run`, `tiny2_run`, ...) is paid once, in the setup
of the first test that asks for it; a test of the other worker that asks for it meanwhile waits for it under
a lock. The table (tests/README.md) sums setup, call and teardown. CPU seconds count this process and the
processes it started and waited for (a Snakemake run with its jobs): they grow far less than wall seconds
with what else the machine runs.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

KINDS = ("workflow", "waits", "dry run", "process", "function")
RECORDER = None  # the Recorder of this process, when GROWLM_TEST_COSTS is set


def note(kind: str) -> None:
    """Record `kind` for the test now running (tests/conftest.py's finished_run: "waits" when it waited for a
    shared run that another worker was making)."""
    if RECORDER is not None and RECORDER.current is not None:
        RECORDER.started.append(kind)


def kind_of(argv) -> str:
    """The kind of one started process, from its argument list."""
    words = [str(w) for w in (argv if isinstance(argv, (list, tuple)) else [argv])]
    if (any(Path(w).name in ("snakemake", "slurm_snakemake.py") for w in words[:3])
            or words[1:3] == ["-m", "snakemake"]):
        dry = {"-n", "--dry-run", "--dryrun", "-np", "--lint", "--summary", "--list-rules"}
        return "dry run" if dry & set(words) else "workflow"
    return "process"


def cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of the processes it started that have ended (each
    with the processes it waited for: a Snakemake run with its jobs). Unlike wall seconds, they do not grow
    with what else the machine runs."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Recorder:
    """A pytest plugin: what each test's phases start, one JSON line per test and phase, in `folder`."""

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.current: tuple[str, str] | None = None
        self.started: list[str] = []
        recorder, original = self, subprocess.Popen.__init__

        def init(popen, args, *a, **kw):
            if recorder.current is not None:
                recorder.started.append(kind_of(args))
            original(popen, args, *a, **kw)

        subprocess.Popen.__init__ = init
        global RECORDER
        RECORDER = self

    def _phase(self, item, phase: str):
        self.current, self.started = (item.nodeid, phase), []
        cpu = cpu_seconds()
        try:
            yield
        finally:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            with open(self.folder / f"{worker}.jsonl", "a") as out:
                out.write(json.dumps({"test": item.nodeid, "phase": phase, "started": self.started,
                                      "cpu_s": round(cpu_seconds() - cpu, 3)}) + "\n")
            self.current = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._phase(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._phase(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._phase(item, "teardown")


DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S.*?)\s*$")


def read_durations(text: str) -> dict[str, float]:
    """{test id: seconds of setup, call and teardown together} from pytest's `--durations=0` lines."""
    seconds: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if m := DURATION.match(line):
            seconds[m.group(3)] += float(m.group(1))
    return dict(seconds)


def read_record(folder: Path) -> tuple[dict[str, str], dict[str, float]]:
    """({test id: its kind}, {test id: its CPU seconds}) from a Recorder's folder."""
    started: dict[str, list[str]] = defaultdict(list)
    cpu: dict[str, float] = defaultdict(float)
    for f in sorted(folder.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            started[row["test"]] += row["started"]
            cpu[row["test"]] += row.get("cpu_s", 0.0)
    return {test: next((k for k in KINDS if k in got), "function") for test, got in started.items()}, dict(cpu)


def table(seconds: dict[str, float], kinds: dict[str, str], cpu: dict[str, float], top: int = 15) -> str:
    """Markdown: by file (tests, wall seconds, share, CPU seconds, the kinds' wall seconds), by kind, and the
    `top` tests of the most wall seconds."""
    total = sum(seconds.values()) or 1.0
    files: dict[str, dict] = defaultdict(lambda: {"tests": 0, "s": 0.0, "cpu": 0.0, **{k: 0.0 for k in KINDS}})
    by_kind: dict[str, list] = {k: [0, 0.0, 0.0] for k in (*KINDS, "unknown")}
    tests = sorted({*seconds, *kinds})  # pytest leaves out the tests under 5 ms
    for test in tests:
        s, kind = seconds.get(test, 0.0), kinds.get(test, "unknown")
        row = files[test.split("::")[0]]
        row["tests"] += 1
        row["s"] += s
        row["cpu"] += cpu.get(test, 0.0)
        if kind in KINDS:
            row[kind] += s
        by_kind[kind][0] += 1
        by_kind[kind][1] += s
        by_kind[kind][2] += cpu.get(test, 0.0)
    lines = ["| file | tests | s | share | CPU s | " + " | ".join(f"{k} s" for k in KINDS) + " |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(KINDS)]
    for name, row in sorted(files.items(), key=lambda kv: -kv[1]["s"]):
        lines.append(f"| {name.removeprefix('tests/')} | {row['tests']} | {row['s']:.0f} | "
                     f"{100 * row['s'] / total:.1f}% | {row['cpu']:.0f} | " + " | ".join(f"{row[k]:.0f}" for k in KINDS)
                     + " |")
    lines += ["", "| a test runs | tests | s | share | CPU s |", "|---|---:|---:|---:|---:|"]
    for kind, (n, s, c) in by_kind.items():
        if n:
            lines.append(f"| {kind} | {n} | {s:.0f} | {100 * s / total:.1f}% | {c:.0f} |")
    lines.append(f"| all | {len(tests)} | {total:.0f} | 100% | {sum(cpu.values()):.0f} |")
    lines += ["", "| test | runs | s | CPU s |", "|---|---|---:|---:|"]
    for test in sorted(seconds, key=lambda t: -seconds[t])[:top]:
        lines.append(f"| {test.removeprefix('tests/')} | {kinds.get(test, 'unknown')} | {seconds[test]:.0f} | "
                     f"{cpu.get(test, 0.0):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    durations = read_durations(Path(sys.argv[1]).read_text())
    kinds, cpu = read_record(Path(sys.argv[2])) if len(sys.argv) > 2 else ({}, {})
    print(table(durations, kinds, cpu))
