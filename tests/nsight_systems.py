"""A real Nsight Systems CLI for the tests, from Debian 12's non-free archive.

Debian bookworm ships Nsight Systems 2022.4.2 (packages ``nsight-systems`` and
``nsight-systems-target``, CUDA 11.8). ``ensure_nsys()`` returns a working ``nsys``: one that is
already installed (``growlm.profiling.tools.find_tool``), else the one this module installed earlier, else
it downloads the two packages with ``apt-get download`` (the non-free component added for this one
call, nothing else touched), unpacks them with ``dpkg-deb -x`` into NVIDIA's own layout

    PREFIX/bin/nsys -> ../target-linux-x64/nsys
    PREFIX/target-linux-x64/   (the CLI, injection libraries)
    PREFIX/host-linux-x64/     (QdstrmImporter, the report scripts)

and fixes the two things the unpacked packages lack: the host directory next to the target one
(Debian puts them in different trees) and ``libssh.so`` (a link relative to /usr/lib in the package;
``apt-get install libssh-4`` gives ``libssh.so.4``). ``PREFIX`` is /opt/nvidia/nsight-systems/2022.4.2,
one of the places ``find_tool`` looks.

Anything that makes this impossible (not root, no apt-get, no network to the Debian archive)
raises ``NsysUnavailable`` with the reason, for ``pytest.skip(reason)``. Set
``GROWLM_NSYS_INSTALL=0`` to forbid the download. Run ``python tests/nsight_systems.py`` to install
it by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from apt_lock import apt_get, apt_install

PREFIX = Path("/opt/nvidia/nsight-systems/2022.4.2")
PACKAGES = ("nsight-systems", "nsight-systems-target")
DEBIAN_SOURCES = "/etc/apt/sources.list.d/debian.sources"


class NsysUnavailable(RuntimeError):
    pass


def _run(cmd, timeout=300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


def _works(nsys: str) -> bool:
    try:
        return _run([nsys, "--version"], timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _nonfree_sources(tmp: Path) -> Path:
    """An apt sources file: the machine's Debian sources with contrib and non-free added."""
    src = Path(DEBIAN_SOURCES)
    if not src.exists():
        raise NsysUnavailable(f"no {DEBIAN_SOURCES}: not a Debian 12 machine")
    text = src.read_text().replace("Components: main\n", "Components: main contrib non-free\n")
    out = tmp / "nonfree.sources"
    out.write_text(text)
    return out


def install(prefix: Path = PREFIX) -> Path:
    """Download and unpack Nsight Systems into `prefix`; returns `prefix`/bin/nsys."""
    if os.geteuid() != 0:
        raise NsysUnavailable("Nsight Systems is not installed and we are not root")
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise NsysUnavailable("Nsight Systems is not installed and there is no apt-get/dpkg-deb")
    with tempfile.TemporaryDirectory(prefix="growlm-nsys-") as tmp:
        tmp = Path(tmp)
        sources = _nonfree_sources(tmp)
        lists = tmp / "lists"
        (lists / "partial").mkdir(parents=True)
        opts = ["-o", f"Dir::Etc::sourcelist={sources}", "-o", "Dir::Etc::sourceparts=/nonexistent",
                "-o", f"Dir::State::lists={lists}", "-o", "Dir::Cache::pkgcache=",
                "-o", "Dir::Cache::srcpkgcache=", "-o", "APT::Sandbox::User=root"]
        for cmd in ([*opts, "update"], [*opts, "download", *PACKAGES]):
            p = apt_get(*cmd, cwd=tmp)
            if p.returncode != 0:
                raise NsysUnavailable(f"apt-get {' '.join(cmd[-2:])} failed: {p.stderr[-800:]}")
        if "libssh.so.4" not in _run(["ldconfig", "-p"]).stdout:
            apt_install("libssh-4")  # checked below, where the library is looked for
        root = tmp / "root"
        for deb in sorted(tmp.glob("*.deb")):
            p = _run(["dpkg-deb", "-x", deb, root])
            if p.returncode != 0:
                raise NsysUnavailable(f"dpkg-deb -x {deb.name} failed: {p.stderr[-500:]}")
        target = root / "usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64"
        host = root / "usr/lib/nsight-systems/host-linux-x64"
        if not (target / "nsys").exists() or not (host / "QdstrmImporter").exists():
            raise NsysUnavailable("the Debian packages hold no target-linux-x64/nsys or QdstrmImporter")
        staging = prefix.parent.parent / f".growlm-nsys-{prefix.name}.partial"  # no find_tool glob sees it
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        shutil.move(target, staging / "target-linux-x64")
        shutil.move(host, staging / "host-linux-x64")
        (staging / "bin").mkdir()
        (staging / "bin" / "nsys").symlink_to("../target-linux-x64/nsys")
        libssh = next((Path(d) / "libssh.so.4" for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu")
                       if (Path(d) / "libssh.so.4").exists()), None)
        if libssh is None:
            raise NsysUnavailable("libssh.so.4 is missing (apt-get install libssh-4 failed?)")
        # the package's link, ../../x86_64-linux-gnu/libssh.so.4, is right only under /usr/lib
        link = staging / "host-linux-x64" / "libssh.so"
        link.unlink(missing_ok=True)
        link.symlink_to(libssh)
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(prefix)
    return prefix / "bin" / "nsys"


def ensure_nsys() -> str:
    """The path of a working nsys, installing Debian's when none is found (see the module doc)."""
    from growlm.profiling.tools import find_tool

    for path in find_tool("nsys"):
        if _works(path):
            return path
    if os.environ.get("GROWLM_NSYS_INSTALL", "1") == "0":
        raise NsysUnavailable("no nsys found and GROWLM_NSYS_INSTALL=0 forbids installing one")
    try:
        nsys = install()
    except subprocess.TimeoutExpired as err:
        raise NsysUnavailable(f"installing Nsight Systems timed out: {err}") from err
    if not _works(str(nsys)):
        raise NsysUnavailable(f"{nsys} --version fails after installing")
    return str(nsys)


if __name__ == "__main__":
    try:
        print(ensure_nsys())
    except NsysUnavailable as err:
        sys.exit(f"nsight_systems: {err}")
