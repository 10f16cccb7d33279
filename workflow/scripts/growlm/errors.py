"""The one exception type for problems a user can fix (bad config, missing file, NaN loss), and the
boundaries where it becomes one line of text instead of a traceback.

Entry points catch it and print one line naming the cause; any other exception is our bug and keeps
its traceback. `job_log` is that boundary for a workflow job (its output goes to the job's log);
`user_errors` for a command-line entry point.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path


class GrowlmError(Exception):
    """A user-facing problem: the message names the cause and what to do."""


@contextlib.contextmanager
def user_errors(stage: str):
    """Turn a GrowlmError into a one-line message on stderr and exit status 1."""
    try:
        yield
    except GrowlmError as err:
        print(f"growlm {stage}: error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)


@contextlib.contextmanager
def job_log(log_file: str | Path, stage: str):
    """Send stdout and stderr to the job's log (its first line says which copy of the library runs);
    a GrowlmError becomes one line (in the log and on the terminal) and exit status 1, with no
    traceback."""
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", buffering=1) as fh:
        print(f"growlm {stage}: library {Path(__file__).resolve().parent}", file=fh, flush=True)
        try:
            with contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
                yield
        except GrowlmError as err:
            msg = f"growlm {stage}: error: {err}"
            print(msg, file=fh, flush=True)
            print(msg, file=sys.__stderr__, flush=True)
            sys.exit(1)
