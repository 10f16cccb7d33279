"""The operator tables of docs/methods.md, rendered from the descriptions: `method_table()` (the
growth operators, or the refinement operators) and `schedule_table()`. docs/tables.py writes them
into the page and tests/test_docs.py compares, so a table is changed by changing a description's
`summary` or options, never by hand.
"""

from __future__ import annotations

from growlm.methods.builtin import OPERATORS
from growlm.methods.spec import LEARNED_MIN_STEPS, LEARNED_SHARE, REFINE, REFINE_SHARE, SCHEDULE, OperatorSpec


_GROWS = {"width": "width", "depth": "depth", "both": "width and depth"}


def _default(value) -> str:
    """An option's default as a config file (YAML) writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _options_cell(spec: OperatorSpec) -> str:
    def default(key, value):
        if key in spec.ramps:
            return f"{REFINE_SHARE} of the shortest refinement"
        if spec.learned and key == "steps":  # the workflow's recipe (growlm.recipes)
            return f"{LEARNED_SHARE} of the shortest refinement, at least {LEARNED_MIN_STEPS}"
        return f"`{_default(value)}`"

    cells = [f"`{key}` ({default(key, value)})" for key, value in spec.options.items()]
    return ", ".join(cells) or "-"


def _what_cell(spec: OperatorSpec) -> str:
    what = spec.summary
    if spec.learned:
        what += " (its training is counted in the cost)"
    for other in spec.absorbs:
        what += f"; `[{spec.name}, {other}]` runs as one fused step"
    if spec.families is not None:
        what += f" ({', '.join(spec.families)} only)"
    return what.replace("|", "\\|")


def method_table(refine: bool = False) -> str:
    """The markdown table of the built-in growth operators (`refine=True`: of the refinement
    operators), one row per `OPERATORS` entry in its order, rendered from the descriptions: what it
    grows, its summary, whether it is exact at step 0, which members it uses, its options (set in
    `grow.options.<name>`) with their defaults; a ramp's default is the share of the shortest
    refinement the grow job gives it. docs/methods.md holds the output (tests/test_docs.py)."""
    specs = [s for s in OPERATORS.values() if s.source == "growlm" and s.axis != SCHEDULE
             and (s.axis == REFINE) == refine]
    if refine:
        rows = ["| in a chain | what the refinement does | options (`grow.options.<name>`) |", "|---|---|---|"]
        rows += [f"| `{s.name}` | {_what_cell(s)} | {_options_cell(s)} |" for s in specs]
    else:
        rows = ["| method | grows | what | exact at step 0 | members | options (`grow.options.<name>`) |",
                "|---|---|---|---|---|---|"]
        rows += [f"| `{s.name}` | {_GROWS[s.axis]} | {_what_cell(s)} | {'yes' if s.exact else 'no'} | "
                 f"{'all n' if s.multi else 'm_1'} | {_options_cell(s)} |" for s in specs]
    return "\n".join(rows) + "\n"


def schedule_table() -> str:
    """The markdown table of the schedules (docs/methods.md), rendered from their descriptions; their
    settings are the config sections of their names."""
    rows = ["| method | what | exact at step 0 |", "|---|---|---|"]
    rows += [f"| `{s.name}` | {_what_cell(s)} | {'yes' if s.exact else 'no'} |"
             for s in OPERATORS.values() if s.axis == SCHEDULE]
    return "\n".join(rows) + "\n"
