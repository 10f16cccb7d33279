"""The library's imports run one way: the layering written in docs/architecture.md is the truth, and holds.

Every module of `growlm` is listed once in the layering of docs/architecture.md ("The library's
layers"), from the bottom up; a module may import only modules listed before it. Function-local imports count too
(they are how cycles hide). The modules the Snakefile imports while Snakemake parses it import
no torch.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "workflow" / "scripts" / "growlm"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = modules()


def _target(module: str, name: str | None = None) -> str | None:
    """The growlm module an import statement loads (a submodule when `from pkg import submodule`)."""
    if name and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return module or None


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported growlm module, line, inside a function) for every import statement of a file."""
    tree = ast.parse(path.read_text())
    local_lines = {node.lineno for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [_target(a.name) for a in node.names if a.name.split(".")[0] == "growlm"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "growlm":
            targets = [_target(node.module, a.name) for a in node.names]
        else:
            continue
        out += [(t, node.lineno, node.lineno in local_lines) for t in targets if t]
    return out


ARCHITECTURE = REPO / "docs" / "architecture.md"


def documented_layers() -> list[list[str]]:
    """The layering block of docs/architecture.md: lines 'layer K  module · module · ...', bottom first."""
    text = ARCHITECTURE.read_text()
    rows = re.findall(r"^layer (\d)\s+(.+)$", text, flags=re.M)
    assert rows, "docs/architecture.md has no layering ('layer 0  errors · ...')"
    assert [int(k) for k, _ in rows] == list(range(len(rows)))
    return [[f"growlm.{m.strip()}" if m.strip() != "growlm" else "growlm" for m in line.split("·")]
            for _, line in rows]


def test_every_module_is_in_the_documented_layering_once():
    listed = [m for layer in documented_layers() for m in layer]
    assert len(listed) == len(set(listed)), [m for m in listed if listed.count(m) > 1]
    assert sorted(listed) == sorted(MODULES), (set(MODULES) ^ set(listed))


def test_imports_point_down_the_layering():
    order = {m: i for i, m in enumerate(m for layer in documented_layers() for m in layer)}
    layer_of = {m: k for k, layer in enumerate(documented_layers()) for m in layer}
    wrong = []
    for name, path in MODULES.items():
        for target, line, _ in imports(path):
            if target != name and order[target] >= order[name]:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {name} (layer {layer_of[name]}) imports {target} "
                             f"(layer {layer_of[target]}), listed after it")
    assert not wrong, "\n".join(wrong)


def test_the_import_graph_has_no_cycle():
    """Independent of the written layering: module-level and function-local imports form no cycle."""
    graph = {name: {t for t, _, _ in imports(path) if t != name} for name, path in MODULES.items()}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail(f"import cycle: {' -> '.join(trail[trail.index(nxt):] + [nxt])}")
            if not state.get(nxt):
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [node])


def test_function_local_imports_only_keep_torch_out_of_snakefile_parsing():
    """A function-local import is allowed only with a comment on its line saying it keeps torch (or
    datasets, which takes seconds to import) out of the Snakefile's parse, or that it imports an
    optional dependency (an extra such as lm-evaluation-harness), which a module that every job
    imports must not need, or that it keeps pandas (or Snakemake's command-line parser, which only the
    Snakefile's parse needs) out of the jobs that train or evaluate (each is a new interpreter: pandas is 0.6
    CPU seconds of every such job's start, snakemake.cli about 0.8)."""
    offenders = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    comment = lines[node.lineno - 1].partition("#")[2]
                    if not (("torch" in comment or "datasets" in comment) and "Snakefile" in comment
                            or "optional dependency" in comment
                            or ("pandas" in comment or "snakemake.cli" in comment) and "jobs" in comment):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_modules_the_snakefile_imports_load_no_torch():
    """Snakemake parses the Snakefile at every start (and in every SLURM job): what it imports must
    not pull in torch (about 2-4 s each time)."""
    smk = "".join(path.read_text() for path in sorted((REPO / "workflow").rglob("*.smk")))
    used = sorted(set(re.findall(r"^from (growlm[\w.]*) import", smk, flags=re.M)))
    assert used, "the workflow's .smk files import nothing from growlm?"
    code = "import sys\n" + "".join(f"import {m}\n" for m in used) + "print(sorted(m for m in sys.modules " \
           "if m.split('.')[0] in ('torch', 'transformers', 'pandas', 'datasets')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"}, check=True).stdout
    assert out.strip() == "[]", (used, out)


MAX_LINES = 500  # the project's limit (CONTRIBUTING.md): a module over it is split where its concerns part


def test_no_module_is_over_the_line_limit():
    """A module holds one concern that a reader can take in whole: none is over MAX_LINES lines (every
    line of the .py file counted, docstrings and blank lines too). One that grows past it is split
    where its concerns part, and the new modules go into the layering above."""
    over = {str(path.relative_to(REPO)): n for path in sorted(MODULES.values())
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: " + ", ".join(f"{p} ({n})" for p, n in over.items())
