"""The one exception type for problems a user can fix (bad config, missing file, NaN loss).

Entry scripts catch it and print one line naming the cause; any other exception is our bug
and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import sys


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
