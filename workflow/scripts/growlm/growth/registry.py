"""The implementations of the growth operators, each registered under the name of its description.

An operator is a function::

    op(models: list[nn.Module], *, n_embd: int, n_layer: int, n_head: int | None,
       seed: int, **options) -> nn.Module

`models` is a list of models of one shape (the n members, or the single output of the previous
operator of a chain). An operator that combines members returns one model; a single-source operator
given several members uses the first. Operators that only change width keep the depth, and vice
versa; `growlm.growth.grow` chains them.

What an operator *is* (what it grows, whether it is exact, its options and constraints) is described
once, torch-free, in `growlm.methods.OPERATORS`. `implements(name)` registers a function as that
description's implementation and checks that its keyword options and defaults are the description's.
`register_operator(...)` does both at once, for operators defined outside growlm (`grow.plugins`).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Callable

from growlm.errors import GrowlmError
from growlm.methods import OPERATORS, REFINE, OperatorSpec, register_spec
from growlm.plugins import describe
from growlm.refiners import REFINERS, register_refiner

IMPLEMENTATIONS: dict[str, Callable] = {}
RESERVED = ("n_embd", "n_layer", "n_head", "seed", "absorbed")  # what grow() passes, not options


def signature_options(fn: Callable) -> dict:
    """The keyword-only options of an operator function, with their defaults."""
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in RESERVED:
            out[p.name] = None if p.default is inspect.Parameter.empty else p.default
    return out


def implements(name: str) -> Callable:
    """Decorator: register `fn` as the implementation of the operator described as `name`."""

    def wrap(fn: Callable) -> Callable:
        spec = OPERATORS.get(name)
        if spec is None:
            raise GrowlmError(f"{fn.__module__}.{fn.__name__} implements {name!r}, which growlm.methods does not "
                              f"describe")
        options = signature_options(fn)
        if options != spec.options:
            raise GrowlmError(f"growth operator {name!r}: the implementation's options {options} differ from its "
                              f"description {spec.options}")
        if name in IMPLEMENTATIONS:
            raise GrowlmError(f"growth operator {name!r} is implemented twice")
        IMPLEMENTATIONS[name] = fn
        return fn

    return wrap


def register_operator(name: str, *, axis: str, exact: bool = False, multi: bool = False, learned: bool = False,
                      ramps: tuple[str, ...] = (), check: Callable | None = None,
                      natural: Callable | None = None, absorbs: tuple[str, ...] = (),
                      families: tuple[str, ...] | None = None, needs: tuple[str, ...] = ()) -> Callable:
    """Decorator: describe and implement a growth operator in one go (for your own operators).

    `axis` ("width", "depth" or "both") says what it grows; `exact` whether the grown model computes
    exactly what m_1 computed (for a multi-member operator: the members' logit average) before any
    training, which the plugin check verifies; `multi` whether it combines all n members (else it gets
    m_1); `learned` whether its map is trained (then it is never given optimizer-state carry-over);
    `ramps` options that are mask-ramp lengths in refinement steps; `families` the model families it
    works on (None, the default: every family of `growlm.families`, those registered later included; the
    config check refuses the operator in any other). Keyword-only parameters of the function (other than
    n_embd, n_layer, n_head, seed) are its options, set in `grow.options`.

    With `axis="refine"` it decorates a refinement operator instead: a subclass of
    `growlm.refiners.Refiner` (`growlm.refiners.register_refiner`; `exact` is then not asked for: a
    refiner changes how M'_1 trains, not what it computes; `ramps` are its step counts; `needs` what it
    needs from the grow job, names of `growlm.methods.GROW_NEEDS`)."""

    def wrap(fn: Callable) -> Callable:
        source = str(Path(inspect.getsourcefile(fn) or fn.__module__).resolve())
        if axis == REFINE:
            cls = register_refiner(name, fn, multi=multi, ramps=tuple(ramps), families=families,
                                   needs=tuple(needs), source=source)
            cls.growlm_operator = name
            return cls
        doc = (fn.__doc__ or "").strip().splitlines()
        register_spec(OperatorSpec(name, axis, exact=exact, multi=multi, learned=learned, ramps=tuple(ramps),
                                   options=signature_options(fn), check=check, natural=natural,
                                   absorbs=tuple(absorbs), summary=doc[0] if doc else "", source=source,
                                   families=families))
        fn = implements(name)(fn)
        fn.growlm_operator = name  # how growlm.plugins.load finds what a plugin file registered
        return fn

    return wrap


def load_plugins(paths) -> list[str]:
    """Import every plugin file of `grow.plugins` (growlm.plugins): their `register_operator`
    decorators describe and implement their operators. Returns the operator names they registered.
    A file already imported in this process whose operators are all still implemented is not run
    again. Every problem names the file; an exception in the user's code is not shown as a traceback."""
    names = []
    for path in paths or ():
        path = Path(path).resolve()
        describe(path)  # the same errors, with the file named, before anything runs
        module_name = f"growlm_plugin_{path.stem}_{abs(hash(str(path))) % 10**8}"
        cached = sys.modules.get(module_name)
        if cached is not None:
            marked = _marked(cached)
            if marked and all(n in OPERATORS and (REFINERS if OPERATORS[n].axis == REFINE else IMPLEMENTATIONS).get(n)
                              is fn for n, fn in marked.items()):  # (an operator since forgotten: import again)
                names += sorted(marked)
                continue
            del sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except GrowlmError as err:
            del sys.modules[module_name]
            raise GrowlmError(f"grow.plugins: {path}: {err}") from None
        except Exception as err:  # the user's code: name the file and the problem, not a traceback
            del sys.modules[module_name]
            raise GrowlmError(f"grow.plugins: {path} failed to import: {type(err).__name__}: {err}") from None
        added = sorted(_marked(module))
        if not added:
            raise GrowlmError(f"grow.plugins: {path} registered no operator when imported (is the decorator "
                              f"growlm.growth.register_operator?)")
        names += added
    return names


def _marked(module) -> dict[str, Callable]:
    """{operator name: function} of the functions `register_operator` registered in a module."""
    return {fn.growlm_operator: fn for fn in vars(module).values()
            if callable(fn) and isinstance(getattr(fn, "growlm_operator", None), str)}
