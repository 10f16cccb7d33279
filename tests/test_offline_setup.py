"""`setup.sh --download` / `--offline`: a set-up from a folder of wheels on a machine without a network.

The whole path (every wheel for this machine fetched into a folder, a fresh venv made from it alone with
pip's index a closed port, the tiny experiment run with it) takes about ten minutes on 2 cores, most of it
installing a hundred wheels; it was run as documented in docs/setup.md ("Without a network"), whose
transcript shows its output. Here, in a copy of setup.sh and pyproject.toml (so that no test makes the
project's own .venv), what it refuses, each with one line naming the cause and the way out, before
anything is installed or fetched.
"""

from __future__ import annotations

import platform
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


def setup(project: Path, *args: str, python: str = sys.executable, path: str = "/usr/bin:/bin",
          env: dict | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": path, "HOME": str(project), "PYTHON": python, "PIP_INDEX_URL": "http://127.0.0.1:9", **(env or {})}
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
    (folder / "growlm-lock.txt").write_text("")  # the exact versions it fetched (none here)
    return folder


def this_python() -> str:
    return "%d.%d" % sys.version_info[:2]


def test_offline_needs_a_folder_that_setup_sh_filled(project, tmp_path):
    (tmp_path / "empty").mkdir()
    line = refused(setup(project, "--offline", "empty"), project)  # relative to where setup.sh was called
    assert line == f"setup.sh: {project / 'empty'} holds no wheels fetched by setup.sh --download (no growlm-wheels.txt)"
    (tmp_path / "empty" / "growlm-wheels.txt").write_text(f"python {this_python()}\n")  # an older setup.sh's folder
    line = refused(setup(project, "--offline", "empty"), project)
    assert line.endswith("has no growlm-lock.txt (fetched by an older setup.sh): fetch it again with bash setup.sh "
                         "--download")


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


def driver(folder: Path, cuda: str = "12.8") -> str:
    """A PATH with an `nvidia-smi` that reports an NVIDIA driver for CUDA `cuda`, as a GPU node's does."""
    folder.mkdir()
    (folder / "nvidia-smi").write_text(f"#!/bin/sh\necho '| NVIDIA-SMI 570.00   Driver Version: 570.00   CUDA Version: {cuda} |'\n")
    (folder / "nvidia-smi").chmod(0o755)
    return f"{folder}:/usr/bin:/bin"


def test_offline_refuses_a_cpu_torch_on_a_machine_with_a_driver(project, tmp_path):
    """A folder fetched on a login node without a GPU holds the CPU build: installed on a GPU node, its jobs
    would claim GPUs and train on the CPU. Refused, unless --cpu-torch says it is meant."""
    folder = wheels(tmp_path / "w", this_python())
    (folder / f"torch-2.13.0+cpu-cp{this_python().replace('.', '')}-none-any.whl").write_text("")
    line = refused(setup(project, "--offline", str(folder), path=driver(tmp_path / "bin")), project)
    assert line.startswith("setup.sh: this machine has an NVIDIA driver (CUDA 12.8) and the torch to install is a "
                           "CPU build (torch-2.13.0+cpu-"), line
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cu130" in line and "--cpu-torch" in line


def test_wheels_for_another_machine_name_its_torch_build(project, tmp_path):
    """Its driver cannot be seen from here: the CUDA build is named (TORCH_INDEX), or the CPU build asked for."""
    line = refused(setup(project, "--download", str(tmp_path / "w"), "--python", "3.12"), project)
    assert line.startswith("setup.sh: the wheels are for another machine, whose driver this one cannot see: name "
                           "its torch build, TORCH_INDEX=https://download.pytorch.org/whl/cu130"), line
    assert "--cpu-torch" in line and "--no-torch" in line
    assert not (tmp_path / "w").exists()  # before anything was fetched


def test_wheels_for_another_architecture_are_refused(project, tmp_path):
    """pip evaluates markers such as platform_machine for the machine that downloads."""
    other = "aarch64" if platform.machine() != "aarch64" else "x86_64"
    line = refused(setup(project, "--download", str(tmp_path / "w"), "--platform", f"manylinux_2_28_{other}",
                         env={"TORCH_INDEX": "https://download.pytorch.org/whl/cu130"}), project)
    assert line.startswith(f"setup.sh: --platform manylinux_2_28_{other} is for {other} and this machine is "
                           f"{platform.machine()}: pip evaluates the packages' markers"), line


@pytest.mark.parametrize("args, said", [
    (["--python", "3.12"], "--python, --platform, --extras and --no-torch go with --download"),
    (["--offline", "w", "--no-torch"], "--python, --platform, --extras and --no-torch go with --download"),
    (["--machine-torch"], "--machine-torch goes with --offline"),
    (["--dowload", "w"], "unknown argument '--dowload'"),
])
def test_options_out_of_place_are_refused(project, args, said):
    line = refused(setup(project, *args), project)
    assert said in line


BACKEND = '''"""A build backend of a few lines, so that building this source archive needs no index."""
import base64, hashlib, os, zipfile

NAME, VERSION = "demo_dep", "0.1.2"
META = f"Metadata-Version: 2.1\\nName: demo-dep\\nVersion: {VERSION}\\n"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    info = f"{NAME}-{VERSION}.dist-info"
    files = {f"{NAME}.py": "VERSION = '0.1.2'\\n", f"{info}/METADATA": META,
             f"{info}/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    record = "".join(f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(v)}\\n" for k, v in files.items()) + f"{info}/RECORD,,\\n"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for k, v in {**files, f"{info}/RECORD": record}.items():
            z.writestr(k, v)
    return name
'''


def wheel(folder: Path, name: str, version: str, requires: tuple = ()) -> None:
    """A pure-Python wheel of metadata only."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


def sha256_of(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def report(path: Path) -> dict[str, tuple[str, str]]:
    """{name: (version, the file it comes from)} of a pip --dry-run --report."""
    import json

    return {item["metadata"]["name"]: (item["metadata"]["version"], Path(item["download_info"]["url"]).name)
            for item in json.loads(path.read_text())["install"]}


def test_both_set_ups_install_exactly_the_committed_lock(project, tmp_path):
    """The lock (requirements-lock.txt) is the one set: the online set-up installs it from the index, the download
    fetches exactly it for a machine without a network and the offline set-up installs it from that folder;
    each checks every file against the lock's hashes. demo-dep's pinned release (0.1.2) is a source archive
    only, an older one (0.0.4) a wheel, as rouge-score's are on PyPI: the download builds 0.1.2 from its
    source (its hash checked first), says so and adds the built wheel's hash to the folder's copy of the lock.
    What each path would install is pip's own report (--dry-run, nothing installed), with no network."""
    import tarfile

    index = tmp_path / "index"
    index.mkdir()
    wheel(index, "demo_parent", "1.0", requires=("demo-dep",))
    wheel(index, "demo_dep", "0.0.4")
    src = tmp_path / "demo-dep-0.1.2"
    src.mkdir()
    (src / "backend.py").write_text(BACKEND)
    (src / "pyproject.toml").write_text('[project]\nname = "demo-dep"\nversion = "0.1.2"\n\n[build-system]\n'
                                        'requires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: demo-dep\nVersion: 0.1.2\n")
    with tarfile.open(index / "demo_dep-0.1.2.tar.gz", "w:gz") as tar:
        tar.add(src, arcname="demo_dep-0.1.2")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "growlm"\nversion = "0.1.0"\nrequires-python = ">=3.11"\n'
        'dependencies = ["torch==2.13.0", "demo-parent==1.0"]\n\n[project.optional-dependencies]\ntest = []\n'
        'eval = []\n\n[build-system]\nrequires = []\nbuild-backend = "setuptools.build_meta"\n')
    (project / "requirements-lock.txt").write_text(
        f"demo-dep==0.1.2 \\\n    --hash=sha256:{sha256_of(index / 'demo_dep-0.1.2.tar.gz')}\n"
        f"demo-parent==1.0 \\\n    --hash=sha256:{sha256_of(index / 'demo_parent-1.0-py3-none-any.whl')}\n")
    from_index = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_NO_CACHE_DIR": "1"}

    folder = tmp_path / "w"
    proc = setup(project, "--download", str(folder), "--no-torch", "--extras", "", env=from_index)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    built = folder / "demo_dep-0.1.2-py3-none-any.whl"
    assert sorted(f.name for f in folder.glob("*.whl")) == [built.name, "demo_parent-1.0-py3-none-any.whl"]
    assert ("setup.sh: demo-dep==0.1.2 has no wheel on the index (the release is a source archive); built "
            "demo_dep-0.1.2-py3-none-any.whl from its source (pure Python)") in proc.stdout, proc.stdout
    copied = (folder / "growlm-lock.txt").read_text()
    assert f"--hash=sha256:{sha256_of(built)}" in copied and sha256_of(index / "demo_dep-0.1.2.tar.gz") in copied

    proc = setup(project, "--dry-run", str(tmp_path / "online.json"), env=from_index)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (project / ".venv").exists()  # nothing installed
    proc = setup(project, "--offline", str(folder), "--machine-torch", "--dry-run", str(tmp_path / "offline.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    online, offline = report(tmp_path / "online.json"), report(tmp_path / "offline.json")
    assert {k: v for k, (v, _) in online.items()} == {k: v for k, (v, _) in offline.items()} == {
        "demo-dep": "0.1.2", "demo-parent": "1.0"}
    assert online["demo-dep"][1] == "demo_dep-0.1.2.tar.gz" and offline["demo-dep"][1] == built.name

    # a file that is not the one locked is refused, online and offline alike
    wheel(index, "demo_parent", "1.0", requires=("demo-dep", "six"))  # the same release, other contents
    proc = setup(project, "--dry-run", str(tmp_path / "again.json"), env=from_index)
    assert proc.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in proc.stderr, proc.stderr[-2000:]


def venv_of_this_python(project: Path) -> None:
    """project/.venv whose python is the suite's own interpreter (its torch), without copying a venv."""
    bin_dir = project / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)


def test_online_setup_replaces_a_cpu_torch_where_a_driver_is_present(project, tmp_path):
    """A .venv made on a GPU-less login node has the CPU build; on a node with a driver the online set-up
    replaces it with the CUDA build for that driver, judged by what the torch reports (torch.version.cuda),
    and keeps it where there is no driver or the CPU build is asked for. `--which-torch` says what the set-up
    would do with .venv's torch, from the same function the set-up acts on."""
    import torch

    if torch.version.cuda:
        pytest.skip(f"the suite's torch {torch.__version__} is a CUDA build")
    venv_of_this_python(project)
    gpu_node = driver(tmp_path / "bin", "12.8")

    def plan(*args, path):
        proc = setup(project, "--which-torch", *args, path=path)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()[-1]

    said = plan(path=gpu_node)
    assert said == (f".venv: replace torch: .venv's torch {torch.__version__} has no CUDA (torch.version.cuda is None) "
                    "and this machine has an NVIDIA driver (CUDA 12.8): its jobs would claim GPUs and train on the "
                    "CPU; torch 2.13.0 from https://download.pytorch.org/whl/cu128 replaces it"), said
    said = plan(path="/usr/bin:/bin")
    assert said == f".venv: keep torch: .venv's torch {torch.__version__} has no CUDA, and this machine has no NVIDIA driver"
    said = plan("--cpu-torch", path=gpu_node)
    assert said.startswith(f".venv: keep torch: .venv's torch {torch.__version__} has no CUDA, and the CPU build is "
                           "the one for this machine (--cpu-torch"), said
    shutil.rmtree(project / ".venv")
    assert plan(path=gpu_node) == ".venv: install torch: .venv has no torch"
