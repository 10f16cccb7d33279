"""The growth operators a config may name, and which of them combine several members.

A plain table, importable without torch, so that the workflow can check a config and plan its jobs
(`growlm.experiment`) while Snakemake parses the Snakefile, which happens at every `snakemake` start
and, on SLURM, in every job. The operators themselves live in `growlm.growth` (its registry is the
truth; `tests/test_growth.py` checks this table against it).
"""

from __future__ import annotations

# name -> uses all n members (True) or only the first, m_1 (False)
OPERATORS: dict[str, bool] = {
    "aki": False,
    "concat": True,
    "fpi": False,
    "hyperclone": False,
    "interleave": False,
    "lemon": False,
    "ligo": True,
    "mango": True,
    "msg": False,
    "net2net": False,
    "stack": False,
    "stack_members": True,
    "zero_block": False,
}
METHODS: list[str] = sorted(OPERATORS)


def members_used(method, n: int) -> int:
    """How many of n members `method` (a name or chain) actually uses: all n when an operator of the
    chain combines members (concat, stack_members, ligo, mango), else only the first (m_1)."""
    chain = [method] if isinstance(method, str) else list(method)
    if not chain:
        return 0
    return n if any(OPERATORS.get(name, False) for name in chain) else min(n, 1)
