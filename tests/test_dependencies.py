"""What growlm imports, it declares: every third-party import of the library, its entry scripts and its
benchmarks is a requirement of pyproject.toml (a dependency or an extra), so that an install from
pyproject.toml (and the lock made from it, `pylock.toml`) has it; a package that only arrives with another
(pyarrow with datasets, jsonschema with snakemake) could go with that one's next release."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

from conftest import REPO

SOURCES = [REPO / "workflow" / "scripts", REPO / "bench"]
# imported only when a user asks for it, installed by the user, and documented so (with the command)
USER_INSTALLED = {"wandb": ("docs/configuration.md", "pip install wandb")}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> dict[str, str]:
    """{canonical distribution name: requirement} of pyproject.toml: dependencies and every extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {canonical(re.split(r"[\[=<>!~;\s]", r, maxsplit=1)[0]): r for r in reqs}


def third_party_imports() -> dict[str, set[str]]:
    """{top-level module: files importing it} of every import outside the standard library and the project's
    own modules (growlm, the entry scripts' and benchmarks' modules beside them)."""
    local = ({"growlm"} | {p.stem for folder in SOURCES for p in folder.glob("*.py")}
             | {p.parent.name for folder in SOURCES for p in folder.glob("*/__init__.py")})  # bench/rendering
    found: dict[str, set[str]] = {}
    for folder in SOURCES:
        for f in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in local and top != "__future__":
                        found.setdefault(top, set()).add(str(f.relative_to(REPO)))
    return found


def test_every_third_party_import_is_declared_in_pyproject():
    dists = importlib.metadata.packages_distributions()
    want = declared()
    problems = []
    imports = third_party_imports()
    assert {"torch", "numpy", "transformers", "scipy", "huggingface_hub"} <= set(imports)  # the scan sees them
    for module, files in sorted(imports.items()):
        if module in USER_INSTALLED:
            page, command = USER_INSTALLED[module]
            assert command in (REPO / page).read_text(), f"{page} should say `{command}`"
            continue
        if module not in dists:
            problems.append(f"{module} (imported by {', '.join(sorted(files))}) is not installed here")
            continue
        if not any(canonical(d) in want for d in dists[module]):
            problems.append(f"{module} (distribution {', '.join(dists[module])}; imported by "
                            f"{', '.join(sorted(files))}) is not declared in pyproject.toml")
    assert not problems, "\n".join(problems)


def test_declared_pins_are_the_versions_installed_here():
    """The pins are exact (NAME==VERSION), and the environment the suite runs in has them: a pin added by hand
    with another version than the one tested would not be what the suite checked."""
    for name, req in declared().items():
        match = re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==([0-9][0-9A-Za-z.+]*)", req)
        assert match, f"pyproject.toml: {req!r} is not an exact pin"
        if name == "torch":  # the build differs (2.13.0+cpu, +cu128): the release is pinned
            assert importlib.metadata.version("torch").split("+")[0] == match.group(2)
        else:
            assert importlib.metadata.version(name) == match.group(2), req


def lock_entries() -> dict[str, tuple[str, str, list[str]]]:
    """{canonical name: (version, marker, sha256 hashes)} of the committed lock, requirements-lock.txt."""
    text = (REPO / "requirements-lock.txt").read_text()
    out = {}
    for entry in re.split(r"(?m)^(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\\n]*?))?\s*\\?\n", entry)
        if m:
            out[canonical(m.group(1))] = (m.group(2), m.group(3) or "", re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
    return out


def test_the_lock_holds_pyprojects_pins_with_hashes_and_is_what_the_suite_runs_on():
    """requirements-lock.txt (`bash setup.sh --lock`, a universal resolution with hashes) holds every pin of
    pyproject.toml at its version, every extra's too, and the build backend; torch is not in it (its build is
    chosen at install); every package has its files' hashes; and where a package's markers hold here, its
    version is the one installed in the environment the suite runs in (made from the lock by setup.sh)."""
    from packaging.markers import Marker
    from packaging.specifiers import SpecifierSet

    lock = lock_entries()
    assert len(lock) > 100 and "torch" not in lock
    for name, req in declared().items():
        if name == "torch":
            continue
        assert name in lock, f"{req} is not in requirements-lock.txt: bash setup.sh --lock"
        assert lock[name][0] == req.split("==")[1], f"{req}, the lock has {lock[name][0]}: bash setup.sh --lock"
    backend = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    for req in backend:
        name, spec = re.match(r"([A-Za-z0-9_.-]+)(.*)", req).groups()
        assert lock[canonical(name)][0] in SpecifierSet(spec), req
    assert all(hashes for _, _, hashes in lock.values()), [n for n, (_, _, h) in lock.items() if not h]
    here = {}
    for name, (version, marker, _) in lock.items():
        if not marker or Marker(marker).evaluate():
            here[name] = (version, importlib.metadata.version(name))
    assert {n: v for n, (v, got) in here.items() if v != got} == {}
