"""The growth methods a config may name: one description per operator, and the chains built from them.

This package is torch-free on purpose: the workflow imports it while Snakemake parses the Snakefile
(at every `snakemake` start and, on SLURM, in every job), and checks every growth chain of the sweep
here, with each operator's own constraints and option names, before any job runs.

`growlm.methods` is the one import path the rest of growlm uses; it gathers the names of its modules,
which part by concern:

    spec      `OperatorSpec`, what a description holds (its fields are explained there), and the names
              every description shares: the axes (`REFINE`, `SCHEDULE`), `GROW_NEEDS`, `REFINE_SHARE`
    builtin   the built-in descriptions with their constraints and the schedules' settings: `OPERATORS`,
              which plugins add to (`register_spec`); `methods()`, `schedules()`, `check_heads`
    chains    a config's method as names and as an id (`method_chain`, `method_id`, `members_used`, ...)
              and the chain planner (`chain_names`, `plan_chain`, `check_options`)
    tables    `method_table()` and `schedule_table()`: the operator tables of docs/methods.md, rendered
              from the descriptions (each operator's `summary` is its table cell; docs/tables.py writes
              them, tests/test_docs.py compares)

The implementations live in `growlm.growth` (torch), the refinement operators' in `growlm.refiners`,
the schedules' in `growlm.schedules`.
"""

from __future__ import annotations

from growlm.methods.builtin import METHODS, OPERATORS, REGROUPS, check_heads, methods, register_spec, schedules
from growlm.methods.chains import (chain_names, chain_needs, chain_options, check_options, growth_names,
                                   is_schedule, is_single_member_control, members_used, method_chain, method_id,
                                   needs_single_member_control, plan_chain, refine_names)
from growlm.methods.spec import (GROW_NEEDS, LEARNED_MIN_STEPS, LEARNED_SHARE, REFINE, REFINE_SHARE, SCHEDULE,
                                 SINGLE_MEMBER, OperatorSpec)
from growlm.methods.tables import method_table, schedule_table

__all__ = ["GROW_NEEDS", "LEARNED_MIN_STEPS", "LEARNED_SHARE", "METHODS", "OPERATORS", "REFINE", "REFINE_SHARE",
           "REGROUPS", "SCHEDULE", "SINGLE_MEMBER", "OperatorSpec", "chain_names", "chain_needs", "chain_options",
           "check_heads", "check_options", "growth_names", "is_schedule", "is_single_member_control", "members_used",
           "method_chain", "method_id", "method_table", "methods", "needs_single_member_control", "plan_chain",
           "refine_names", "register_spec", "schedule_table", "schedules"]
