"""Your own growth operators, from Python files a config names (`grow.plugins: [my_method.py]`).

A plugin is a Python file that defines operators with the public decorator::

    from growlm.growth import register_operator

    @register_operator("my_method", axis="both", exact=False, multi=True)
    def my_method(models, *, n_embd, n_layer, n_head=None, seed=0, alpha: float = 0.5):
        ...

or refinement operators, with the same decorator on a `growlm.refiners.Refiner` subclass::

    @register_operator("my_refiner", axis="refine", ramps=("my_steps",))
    class MyRefiner(Refiner):
        def __init__(self, *, my_steps: int = 100, strength: float = 0.1):
            ...

Two readings of the same file:

* `describe(path)` reads it *without running it* (with `ast`), so that the Snakefile can check every
  method of the sweep, with the plugin's option names, while Snakemake parses it - no torch, no
  import of the user's code in the Snakemake process. The decorator's arguments and the options'
  defaults must therefore be literals (numbers, strings, booleans, None, tuples/lists of them).
* `growlm.growth.registry.load_plugins(paths)` imports it (in the jobs that grow, and in the check
  before any training): the decorator then registers the real function, replacing the description
  `describe` made.

Every problem names the file: a syntax error (with its line), a file that defines no operator, a
decorator argument that is not a literal, an operator name growlm already has.
"""

from __future__ import annotations

import ast
from pathlib import Path

from growlm.errors import GrowlmError
from growlm.methods import OperatorSpec, register_spec

DECORATOR = "register_operator"
RESERVED = ("n_embd", "n_layer", "n_head", "seed", "absorbed")  # what grow() passes, not options
_SPEC_KEYS = ("axis", "exact", "multi", "learned", "ramps", "families", "needs")


def _literal(node: ast.AST, path: Path, what: str):
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise GrowlmError(f"grow.plugins: {path}, line {node.lineno}: {what} must be a literal (a number, string, "
                          f"boolean, None or a tuple of them) so that growlm can read it without running the "
                          f"file, not {ast.unparse(node)!r}") from None


def _is_decorator(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id == DECORATOR) or (isinstance(f, ast.Attribute) and f.attr == DECORATOR)


def describe(path: str | Path) -> list[OperatorSpec]:
    """The operators a plugin file declares, read without running it (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise GrowlmError(f"grow.plugins: {path} does not exist (paths are relative to the working folder)")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as err:
        raise GrowlmError(f"grow.plugins: {path}, line {err.lineno}: syntax error: {err.msg}") from None
    specs = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for dec in fn.decorator_list:
            if not _is_decorator(dec):
                continue
            if not dec.args or not isinstance(dec.args[0], ast.Constant) or not isinstance(dec.args[0].value, str):
                raise GrowlmError(f"grow.plugins: {path}, line {dec.lineno}: @{DECORATOR} needs the operator's "
                                  f"name as its first argument, a string")
            kw = {k.arg: k.value for k in dec.keywords}
            if isinstance(fn, ast.ClassDef) or ("axis" in kw and _literal(kw["axis"], path, "axis=") == "refine"):
                specs.append(_describe_refiner(fn, dec, kw, path))
                continue
            missing = [k for k in ("axis", "exact") if k not in kw]
            if missing:
                raise GrowlmError(f"grow.plugins: {path}, line {dec.lineno}: @{DECORATOR}({dec.args[0].value!r}) "
                                  f"needs {' and '.join(missing)}= (what it grows; whether it is exact at step 0)")
            spec = {k: _literal(v, path, f"{k}=") for k, v in kw.items() if k in _SPEC_KEYS}
            a = fn.args
            defaults = [None] * (len(a.kwonlyargs) - len(a.kw_defaults)) + list(a.kw_defaults)
            options = {}
            for arg, default in zip(a.kwonlyargs, defaults):
                if arg.arg in RESERVED:
                    continue
                options[arg.arg] = None if default is None else _literal(default, path, f"the default of {arg.arg}")
            doc = (ast.get_docstring(fn) or "").strip().splitlines()
            specs.append(OperatorSpec(dec.args[0].value, spec["axis"], exact=bool(spec["exact"]),
                                      multi=bool(spec.get("multi", False)), learned=bool(spec.get("learned", False)),
                                      ramps=tuple(spec.get("ramps", ())), options=options,
                                      families=spec.get("families"),
                                      summary=doc[0] if doc else "", source=str(path.resolve())))
    if not specs:
        raise GrowlmError(f"grow.plugins: {path} defines no growth operator: decorate a function with "
                          f"@{DECORATOR}(name, axis=..., exact=...) from growlm.growth")
    return specs


def _describe_refiner(cls: ast.AST, dec: ast.Call, kw: dict, path: Path) -> OperatorSpec:
    """A refinement operator's description: a class (a growlm.refiners.Refiner) whose __init__'s
    keyword-only parameters, but those its `inputs = (...)` names, are its options."""
    name = dec.args[0].value
    if not isinstance(cls, ast.ClassDef) or _literal(kw.get("axis", ast.Constant("refine")), path, "axis=") != "refine":
        raise GrowlmError(f"grow.plugins: {path}, line {dec.lineno}: @{DECORATOR}({name!r}) on a class describes a "
                          f"refinement operator: give it axis=\"refine\" and a subclass of growlm.refiners.Refiner "
                          f"(a growth operator is a function)")
    spec = {k: _literal(v, path, f"{k}=") for k, v in kw.items() if k in _SPEC_KEYS}
    inputs: tuple = ()
    options = {}
    for node in cls.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "inputs" for t in node.targets):
            inputs = tuple(_literal(node.value, path, "inputs"))
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            a = node.args
            defaults = [None] * (len(a.kwonlyargs) - len(a.kw_defaults)) + list(a.kw_defaults)
            for arg, default in zip(a.kwonlyargs, defaults):
                if arg.arg not in inputs:
                    options[arg.arg] = None if default is None else _literal(default, path,
                                                                             f"the default of {arg.arg}")
    doc = (ast.get_docstring(cls) or "").strip().splitlines()
    owns_loss = any(isinstance(node, ast.FunctionDef) and node.name == "loss" for node in cls.body)
    return OperatorSpec(name, "refine", exact=True, multi=bool(spec.get("multi", False)), owns_loss=owns_loss,
                        ramps=tuple(spec.get("ramps", ())), options=options, needs=tuple(spec.get("needs", ())),
                        families=spec.get("families"), summary=doc[0] if doc else "",
                        source=str(path.resolve()))


def declare(paths) -> list[str]:
    """Describe every plugin file's operators in `growlm.methods.OPERATORS` (torch-free; the
    Snakefile's method check). Returns the operator names, in file order. Idempotent per file."""
    names = []
    for path in paths or ():
        for spec in describe(path):
            try:
                register_spec(spec)
            except GrowlmError as err:
                raise GrowlmError(f"grow.plugins: {path}: {err}") from None
            names.append(spec.name)
    return names
