"""`growlm.atomic`: the one way growlm writes a file or folder in place of another (a unique temporary in
the target's folder, fsynced, `os.replace`d), and that every such write in the library goes through it."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest

from conftest import REPO
from growlm import atomic
from growlm.atomic import atomic_folder, atomic_path, write_atomic, write_json_atomic

LIBRARY = REPO / "workflow" / "scripts" / "growlm"


def test_every_write_in_place_of_a_file_goes_through_growlm_atomic():
    """No module but growlm.atomic renames a temporary onto a file (`os.replace`, `os.rename`) or names one
    `.tmp`: a fixed temporary name is shared by two writers of one target (two profiling jobs write the
    profile-tools cache in ~/.cache at once), and a rename without fsync can leave a file that never
    reached the disk."""
    found = []
    for f in sorted(LIBRARY.rglob("*.py")):
        if f.name == "atomic.py" and f.parent == LIBRARY:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
                    and node.func.attr in ("replace", "rename", "renames")):
                found.append(f"{f.relative_to(LIBRARY)}:{node.lineno}: os.{node.func.attr}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value.endswith(".tmp") or node.value.startswith(".tmp")):
                found.append(f"{f.relative_to(LIBRARY)}:{node.lineno}: {node.value!r}")
    assert not found, "write through growlm.atomic instead:\n" + "\n".join(found)


def test_two_writers_of_one_target_each_write_their_own_temporary(tmp_path):
    """Both in flight at once (as two profiling jobs writing the tools cache): each writes a temporary of its
    own in the target's folder, neither disturbs the other, the last to finish wins, nothing is left."""
    target = tmp_path / "cache" / "profile_tools.json"
    with atomic_path(target) as first, atomic_path(target) as second:
        assert first != second and first.parent == second.parent == target.parent
        first.write_text("first")
        second.write_text("second")
        assert not target.exists()  # not before a writer finished
    assert target.read_text() == "first"  # the outer block finished last
    assert [p.name for p in target.parent.iterdir()] == ["profile_tools.json"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_the_ledger_half_written_leaves_no_temporary(tmp_path):
    """The training ledger's writer, failing in the middle of its rows, leaves the ledger as it was and no
    temporary beside it (a fixed `ledger.tmp` was left behind, and taken by the next writer)."""
    from growlm.train import _write_ledger

    ledger = tmp_path / "ledger.csv"
    _write_ledger(ledger, [{"step": 1}])
    whole = ledger.read_text()
    with pytest.raises(AttributeError):
        _write_ledger(ledger, [{"step": 1}, None])
    assert ledger.read_text() == whole and whole.splitlines()[1].startswith("1,")
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.csv"]


def test_the_data_is_fsynced_before_the_rename_and_the_mode_follows_the_umask(tmp_path, monkeypatch):
    """fsync of the temporary before `os.replace` (a crash after the rename must not leave a file whose data
    never reached the disk); the file gets the mode an ordinary `open` gives it (tempfile.mkstemp's 0600
    would make a shared results folder unreadable to the group)."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                        real_fsync(fd)))
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append(("replace", str(a))), real_replace(a, b)))
    target = tmp_path / "run.json"
    write_json_atomic(target, {"a": 1})
    kinds = [kind for kind, _ in events]
    replaced = next(path for kind, path in events if kind == "replace")
    assert ("fsync", replaced) in events and kinds.index("fsync") < kinds.index("replace")
    assert Path(replaced).parent == tmp_path and Path(replaced).name.startswith(".tmp.run.json.")
    assert events[-1] == ("fsync", str(tmp_path))  # the folder, after the rename
    plain = tmp_path / "plain"
    plain.write_text("")
    assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    assert target.read_text() == '{"a": 1}'


def test_a_folder_replaces_the_old_one_whole_or_not_at_all(tmp_path):
    final = tmp_path / "step_00000004"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_folder(final) as tmp:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert [p.name for p in final.iterdir()] == ["old.txt"] and [p.name for p in tmp_path.iterdir()] == [final.name]
    with atomic_folder(final) as tmp:
        (tmp / "model.safetensors").write_bytes(b"whole")
    assert [p.name for p in final.iterdir()] == ["model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == [final.name]
    assert write_atomic(tmp_path / "x.txt", "é").read_bytes() == "é".encode()


def test_a_checkpoint_half_written_by_a_killed_job_is_removed_at_the_next_save(tmp_path):
    """A checkpoint's temporary (gigabytes) left by a job killed while writing it is removed when the job that
    holds the folder next saves one (a fixed name was overwritten; unique names would pile up)."""
    import torch

    from growlm.checkpoint import save_checkpoint, verify

    stale = tmp_path / ".tmp.step_00000004.4242.0123456789abcdef"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    final = save_checkpoint(tmp_path, 4, model, optimizer, {"step": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004"] and verify(final) is None
