"""The registry of growth operators: each is a function registered under a name.

An operator has the signature::

    op(models: list[nn.Module], *, n_embd: int, n_layer: int, n_head: int | None,
       seed: int, **options) -> nn.Module

`models` is a list of models of one shape (the n members, or the single output of the previous
operator of a chain). An operator that consumes several members returns one model; a single-source
operator given several members uses the first (and says so in its docstring). Operators that only
change width must keep the depth, and vice versa; `grow()` chains them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

OPERATORS: dict[str, "Operator"] = {}


@dataclass(frozen=True)
class Operator:
    name: str
    fn: Callable
    kind: str  # "width", "depth", "both", "combine"
    exact: bool  # function-preserving at step 0
    multi: bool  # uses all n members (not only the first)
    doc: str = field(default="")


def register(name: str, *, kind: str, exact: bool, multi: bool = False):
    """Decorator: register `fn` as growth operator `name`."""

    def wrap(fn):
        if name in OPERATORS:
            raise ValueError(f"growth operator {name!r} registered twice")
        OPERATORS[name] = Operator(name, fn, kind, exact, multi, (fn.__doc__ or "").strip())
        return fn

    return wrap
