"""Where the suite's time goes: each test's seconds, grouped by file and by what the test runs.

Record a run (every process a test or its fixtures start, by kind), then group its `--durations=0`:

    GROWLM_TEST_COSTS=/tmp/kinds .venv/bin/python -m pytest -ra --durations=0 -p no:cacheprovider | tee /tmp/durations.txt
    .venv/bin/python tests/suite_costs.py /tmp/durations.txt /tmp/kinds

A test's kind is the heaviest thing it (or a fixture it set up) started:

- `workflow`: a Snakemake run that runs jobs (each job a new interpreter that imports torch);
- `dry run`: Snakemake started for a plan, a lint or a refusal before any job (no job runs);
- `process`: another interpreter or command (a training job, torchrun, a benchmark, Chromium, SLURM);
- `function`: nothing started, everything in the test's own process.

A session fixture's run (tests/conftest.py: `tiny_run`, `finished_run`) is paid once, in the setup of
the first test in each pytest-xdist worker that asks for it; the other worker waits for it under a lock.
The table (tests/README.md) sums setup, call and teardown.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

KINDS = ("workflow", "dry run", "process", "function")


def kind_of(argv) -> str:
    """The kind of one started process, from its argument list."""
    words = [str(w) for w in (argv if isinstance(argv, (list, tuple)) else [argv])]
    if any(Path(w).name == "snakemake" for w in words[:3]) or words[1:3] == ["-m", "snakemake"]:
        dry = {"-n", "--dry-run", "--dryrun", "-np", "--lint", "--summary", "--list-rules"}
        return "dry run" if dry & set(words) else "workflow"
    return "process"


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

    def _phase(self, item, phase: str):
        self.current, self.started = (item.nodeid, phase), []
        try:
            yield
        finally:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            with open(self.folder / f"{worker}.jsonl", "a") as out:
                out.write(json.dumps({"test": item.nodeid, "phase": phase, "started": self.started}) + "\n")
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


def read_kinds(folder: Path) -> dict[str, str]:
    """{test id: its kind} from a Recorder's folder."""
    started: dict[str, list[str]] = defaultdict(list)
    for f in sorted(folder.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            started[row["test"]] += row["started"]
    return {test: next((k for k in KINDS if k in got), "function") for test, got in started.items()}


def table(seconds: dict[str, float], kinds: dict[str, str]) -> str:
    """Markdown: by file (tests, seconds, share, the kinds' seconds), then by kind."""
    total = sum(seconds.values()) or 1.0
    files: dict[str, dict] = defaultdict(lambda: {"tests": 0, "s": 0.0, **{k: 0.0 for k in KINDS}})
    by_kind: dict[str, list] = {k: [0, 0.0] for k in (*KINDS, "unknown")}
    for test in sorted({*seconds, *kinds}):  # pytest leaves out the tests under 5 ms
        s = seconds.get(test, 0.0)
        row, kind = files[test.split("::")[0]], kinds.get(test, "unknown")
        row["tests"] += 1
        row["s"] += s
        if kind in KINDS:
            row[kind] += s
        by_kind[kind][0] += 1
        by_kind[kind][1] += s
    lines = ["| file | tests | s | share | workflow s | dry run s | process s | function s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in sorted(files.items(), key=lambda kv: -kv[1]["s"]):
        lines.append(f"| {name} | {row['tests']} | {row['s']:.0f} | {100 * row['s'] / total:.1f}% | "
                     + " | ".join(f"{row[k]:.0f}" for k in KINDS) + " |")
    lines += ["", "| a test runs | tests | s | share |", "|---|---:|---:|---:|"]
    for kind, (n, s) in by_kind.items():
        if n:
            lines.append(f"| {kind} | {n} | {s:.0f} | {100 * s / total:.1f}% |")
    lines.append(f"| all | {len({*seconds, *kinds})} | {total:.0f} | 100% |")
    return "\n".join(lines)


if __name__ == "__main__":
    durations = read_durations(Path(sys.argv[1]).read_text())
    print(table(durations, read_kinds(Path(sys.argv[2])) if len(sys.argv) > 2 else {}))
