"""Writing a file or a folder so that its readers see the old one or the whole new one, never a part.

Every file growlm writes in place of another (a ledger, a memory plan, a profile's JSON, a checkpoint, a
downloaded corpus file, the digest and task caches, the profile-tools cache in ~/.cache) goes through
`atomic_path` or `atomic_folder`:

* **a unique temporary name in the target's own folder**, `.tmp.<name>.<pid>.<random>`: `os.replace` is
  atomic only within one file system, so the temporary is never put in /tmp; and two writers of one
  target (two profiling jobs probing the tools at once write the shared cache in ~/.cache; two ranks or
  two jobs on a shared file system) each write their own temporary, where a fixed `<name>.tmp` let the
  second truncate the first's half-written file or rename it away under it. The name is made, not
  created (`tempfile.mkstemp` would create it with mode 0600, and a result renamed from it would be
  unreadable to the group on a shared file system); the process id and 64 random bits make it unique.
* **fsync before the rename**, then of the folder after it: without it a crash of the machine can leave
  the new name pointing at a file whose data never reached the disk (ext4 and XFS commit the rename
  before the data), which a resumed run would take for whole.
* **`os.replace`**, which replaces the target in one step on POSIX file systems; if the block that
  writes raises, the temporary is removed and the target is left as it was.

Torch-free, layer 0 (`docs/architecture.md`): the Snakefile's modules use it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path


def temporary_name(path: str | Path) -> Path:
    """A name in `path`'s folder that no other writer uses: `.tmp.<name>.<pid>.<16 hex digits>`."""
    path = Path(path)
    return path.with_name(f".tmp.{path.name}.{os.getpid()}.{secrets.token_hex(8)}")


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Remove the temporaries left in `folder` by writers that were killed before they renamed them (a
    checkpoint's folder can be gigabytes); only for a folder that has one writer at a time, as a training
    job's checkpoint folder, whose job holds it. Returns what was removed."""
    gone = []
    for tmp in Path(folder).glob(".tmp.*"):
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        gone.append(tmp)
    return gone


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """fsync a folder, so that a rename in it is on disk; some file systems refuse it (then the rename
    is as durable as they make it)."""
    try:
        _fsync(folder)
    except OSError:
        pass


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write the new file to (by any writer that takes a path:
    `open`, safetensors' `save_file`, ...); when the block ends without an error, the file is fsynced and
    renamed onto `path`. On an error it is removed and `path` is left as it was. Makes `path`'s folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_folder(path.parent)


@contextlib.contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Like `atomic_path` for a folder: yield an empty temporary folder beside `path`; when the block
    ends without an error, every file in it is fsynced, a folder already at `path` is removed and the new
    one renamed onto it (a crash between the two leaves no folder at `path`, never a partial one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    tmp.mkdir()
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                _fsync(f)
        _fsync_folder(tmp)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _fsync_folder(path.parent)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8, or bytes) to `path` atomically; returns `path`."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def write_json_atomic(path: str | Path, data, **dumps) -> Path:
    """Write `data` as JSON (`json.dumps(data, **dumps)`) to `path` atomically; returns `path`."""
    return write_atomic(path, json.dumps(data, **dumps))
