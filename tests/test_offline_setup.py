"""`setup.sh --download` / `--offline`: a set-up from a folder of wheels on a machine without a network.

The whole path (every wheel for this machine fetched into a folder, a fresh venv made from it alone with
pip's index a closed port, the tiny experiment run with it) takes about ten minutes on 2 cores, most of it
installing a hundred wheels; it was run as documented in docs/setup.md ("Without a network"), whose
transcript shows its output. Here, in a copy of setup.sh and pyproject.toml (so that no test makes the
project's own .venv), what it refuses, each with one line naming the cause and the way out, before
anything is installed or fetched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


@pytest.fixture
def project(tmp_path) -> Path:
    for name in ("setup.sh", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def setup(project: Path, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(project), "PYTHON": python, "PIP_INDEX_URL": "http://127.0.0.1:9"}
    return subprocess.run(["bash", str(project / "setup.sh"), *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=120)


def refused(proc: subprocess.CompletedProcess, project: Path) -> str:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert not (project / ".venv").exists()  # refused before a venv was made
    lines = [line for line in proc.stderr.splitlines() if line.startswith("setup.sh: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def wheels(folder: Path, python: str) -> Path:
    folder.mkdir()
    (folder / "growlm-wheels.txt").write_text(f"python {python}\nplatform this machine\ntorch none\nextras \n")
    return folder


def this_python() -> str:
    return "%d.%d" % sys.version_info[:2]


def test_offline_needs_a_folder_that_setup_sh_filled(project, tmp_path):
    (tmp_path / "empty").mkdir()
    line = refused(setup(project, "--offline", "empty"), project)  # relative to where setup.sh was called
    assert line == f"setup.sh: {project / 'empty'} holds no wheels fetched by setup.sh --download (no growlm-wheels.txt)"


def test_offline_refuses_wheels_for_another_python(project, tmp_path):
    folder = wheels(tmp_path / "w", "3.99")
    line = refused(setup(project, "--offline", str(folder)), project)
    assert f"are for Python 3.99 and {sys.executable} is Python {this_python()}" in line
    assert "fetch them with --python " + this_python() in line and "PYTHON=python3.99" in line


def test_offline_without_torch_in_the_folder_or_on_the_machine_says_where_to_get_it(project, tmp_path):
    bare = Path(sys.base_prefix) / "bin" / "python3"  # the interpreter the venv came from
    if subprocess.run([str(bare), "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{bare} has torch")
    folder = wheels(tmp_path / "w", this_python())
    line = refused(setup(project, "--offline", str(folder), python=str(bare)), project)
    assert line.startswith(f"setup.sh: torch 2.13.0 is neither in {folder} nor {bare}'s own (none)")
    assert "bash setup.sh --download" in line and "--machine-torch" in line
    line = refused(setup(project, "--offline", str(folder), "--machine-torch", python=str(bare)), project)
    assert line == f"setup.sh: --machine-torch, but {bare} has no torch"


def test_download_refuses_an_unknown_extra_before_fetching(project, tmp_path):
    proc = setup(project, "--download", str(tmp_path / "w"), "--extras", "test,gpus")
    assert proc.returncode != 0 and "setup.sh: no extra gpus in pyproject.toml" in proc.stderr
    assert not list((tmp_path / "w").glob("*.whl"))


@pytest.mark.parametrize("args, said", [
    (["--python", "3.12"], "--python, --platform, --extras and --no-torch go with --download"),
    (["--offline", "w", "--no-torch"], "--python, --platform, --extras and --no-torch go with --download"),
    (["--machine-torch"], "--machine-torch goes with --offline"),
    (["--dowload", "w"], "unknown argument '--dowload'"),
])
def test_options_out_of_place_are_refused(project, args, said):
    line = refused(setup(project, *args), project)
    assert said in line
