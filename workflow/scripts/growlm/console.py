"""What a job says: its timestamped log lines, and warnings that also reach the terminal.

Every job of the workflow writes its log through `log` (stdout, which `growlm.errors.job_log` sends to
the job's log file); a legal but surprising setting is a `warn`ing, shown in the terminal where
Snakemake runs as well, so that it does not hide in a log file.
"""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    """One timestamped line on stdout (the job's log file)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def warn(msg: str) -> None:
    """A warning in the job's log and in the terminal where Snakemake runs."""
    log(f"warning: {msg}")
    print(f"growlm: warning: {msg}", file=sys.__stderr__, flush=True)
