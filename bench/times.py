"""Time a command and append its row to bench/results/times.csv, the file the pages' times are rendered from.

    .venv/bin/python bench/times.py default_run -- .venv/bin/snakemake --cores 2
    .venv/bin/python bench/times.py suite --how "pytest -ra, fresh clone, empty compile cache" -- .venv/bin/python -m pytest -ra

A row says what was timed, its wall-clock seconds, the commit the clone was at (`git rev-parse --short HEAD`),
the cores the machine had, the date and how it was measured; set-up is timed apart (a row of its own). README,
RESULTS and config/config.yaml's comments print a time only from a row of this file (`bench/render_results.py`).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

TIMES = Path(__file__).resolve().parent / "results" / "times.csv"
COLUMNS = ["what", "seconds", "commit", "cores", "date", "tests", "how"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/times.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", help="the row's name, e.g. default_run, suite")
    parser.add_argument("--how", default="", help="how it was measured (default: the command)")
    parser.add_argument("--tests", default="", help="the number of tests, for a run of the suite")
    parser.add_argument("--out", type=Path, default=TIMES)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to time")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to time: give it after --")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    start = time.monotonic()
    rc = subprocess.run(command).returncode
    seconds = round(time.monotonic() - start)
    if rc != 0:
        print(f"the command failed (exit {rc}); no row written", file=sys.stderr)
        return rc
    new = not args.out.exists()
    with open(args.out, "a", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        if new:
            w.writeheader()
        w.writerow({"what": args.what, "seconds": seconds, "commit": commit, "cores": len(os.sched_getaffinity(0)),
                    "date": datetime.date.today().isoformat(), "tests": args.tests,
                    "how": args.how or " ".join(command)})
    print(f"{args.what}: {seconds} s at {commit}; row added to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
