"""apt-get for the test set-up (SLURM, Chromium, Nsight Systems), one call at a time.

The tests run in two pytest-xdist workers, and two apt-get calls at once fail on dpkg's lock (or,
for `apt-get update`, on the lists lock, which DPkg::Lock::Timeout does not cover). Every call
here first takes an exclusive lock on one file, and also asks dpkg to wait for its own lock in case
something outside the tests holds it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "growlm-tests-apt.lock"


def apt_get(*args: str, timeout: float = 600, cwd=None) -> subprocess.CompletedProcess:
    """`apt-get -o DPkg::Lock::Timeout=600 ARGS` (non-interactive) under the tests' apt lock."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=600", *map(str, args)]
    with open(LOCK, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def apt_install(*packages: str) -> subprocess.CompletedProcess:
    """`apt-get install -y --no-install-recommends PACKAGES`; when that fails (stale or missing
    package lists), `apt-get update` and one more try. Returns the last install's result."""
    install = ("install", "-y", "-qq", "--no-install-recommends", *packages)
    p = apt_get(*install)
    if p.returncode != 0:
        apt_get("update", "-qq", timeout=300)
        p = apt_get(*install)
    return p
