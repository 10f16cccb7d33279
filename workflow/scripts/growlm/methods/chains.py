"""Chains of operators: a config's method (a name or a chain) as names and as a path component, what
it uses and needs, and the chain planner (`plan_chain`: which operator grows what, to which
intermediate size, checked against each operator's constraints before any job runs).

Torch-free, like all of `growlm.methods`; it reads the descriptions in `OPERATORS` when called, so
plugin operators registered after import are planned like the built-in ones.
"""

from __future__ import annotations

from growlm.errors import GrowlmError
from growlm.methods.builtin import OPERATORS, methods
from growlm.methods.spec import GROW_NEEDS, REFINE, SCHEDULE, SINGLE_MEMBER
from growlm.shape import ModelShape


# ----------------------------------------------------------------------------------------------
# method ids: a config's method (a name or a chain), as a path component
# ----------------------------------------------------------------------------------------------

def method_chain(method) -> list[str]:
    """A config method (a name, a list of names, or an id 'a+b', maybe with the control suffix)
    as a list of operator names."""
    if isinstance(method, str):
        return method.removesuffix(SINGLE_MEMBER).split("+")
    return [str(m) for m in method]


def method_id(method) -> str:
    """The path-safe id of a method or chain: names joined by '+'."""
    return "+".join(method_chain(method))


def is_single_member_control(method_id_: str) -> bool:
    return method_id_.endswith(SINGLE_MEMBER)


def is_schedule(method) -> bool:
    """Whether `method` (a name, chain or id) is, or wrongly chains, a schedule."""
    return any(name in OPERATORS and OPERATORS[name].axis == SCHEDULE for name in method_chain(method))



def growth_names(method) -> list[str]:
    """The operators of a method that grow (its refinement operators left out)."""
    return [nm for nm in method_chain(method) if nm not in OPERATORS or OPERATORS[nm].axis != REFINE]


def refine_names(method) -> list[str]:
    """The refinement operators of a method (teach, freeze, carry), in chain order."""
    return [nm for nm in method_chain(method) if nm in OPERATORS and OPERATORS[nm].axis == REFINE]


def chain_needs(method) -> list[str]:
    """What the grow job of `method` provides for its refinement operators: their `needs`, in
    `GROW_NEEDS` order (each once)."""
    needs = {need for nm in refine_names(method) for need in OPERATORS[nm].needs}
    return [need for need in GROW_NEEDS if need in needs]


def members_used(method, n: int) -> int:
    """How many of n members `method` (a name or chain) actually uses: all n when an operator of the
    chain combines members, else only the first (m_1); none for a schedule."""
    chain = method_chain(method)
    if not chain or is_schedule(chain):
        return 0
    return n if any(OPERATORS[name].multi for name in chain if name in OPERATORS) else min(n, 1)


def needs_single_member_control(method) -> bool:
    """Whether the m_1-only control of `method` differs from the method itself: only chains with an
    operator that combines several members do; a single-source chain already grows m_1 alone, and
    the schedules use no member."""
    return members_used(method, 2) > 1


# ----------------------------------------------------------------------------------------------
# chains: which operator grows what, to which intermediate size
# ----------------------------------------------------------------------------------------------

_AXIS_ORDER = {"width": 0, "both": 1, "depth": 2, REFINE: 3}


def chain_names(method) -> list[str]:
    """The operator names of a method, checked: known, not repeated, not empty."""
    names = [method] if isinstance(method, str) else list(method)
    if not names:
        raise GrowlmError("empty growth method chain")
    for name in names:
        if not isinstance(name, str) or name not in OPERATORS:
            raise GrowlmError(f"unknown growth method {name!r}; known: {', '.join(methods())}")
        if OPERATORS[name].axis == SCHEDULE:
            raise GrowlmError(f"{name} is a training schedule and cannot be chained; list it alone")
    if len(set(names)) != len(names):
        raise GrowlmError(f"growth chain {names} repeats an operator")
    refine = [nm for nm in names if OPERATORS[nm].axis == REFINE]
    if len(refine) == len(names):
        raise GrowlmError(f"growth chain {names} has only refinement operators ({', '.join(refine)}); they change "
                          f"how a grown model is refined, so add a growth operator, e.g. {['msg', *names]}")
    owners = [nm for nm in refine if OPERATORS[nm].owns_loss]
    if len(owners) > 1:
        raise GrowlmError(f"growth chain {names}: {' and '.join(owners)} each replace the training loss (their "
                          f"`loss`), and a step minimises one loss: one of them would silently not run while its "
                          f"cost was still counted. Keep one of them in the chain, or write one refiner whose loss "
                          f"combines both")
    learned = [nm for nm in names if OPERATORS[nm].learned]
    for nm in refine:
        if OPERATORS[nm].needs and learned:
            raise GrowlmError(f"growth chain {names}: {nm} needs {' and '.join(OPERATORS[nm].needs)} from the grow "
                              f"job, which only an operator affine in the members' weights gives, and {learned[0]} "
                              f"is learned")
    return names


def plan_chain(shape: ModelShape, n: int, method, *, n_embd: int, n_layer: int,
               n_head: int | None = None) -> list[tuple[list[str], int, int, int | None]]:
    """The steps of a chain that grows n members of `shape` to width `n_embd`, depth `n_layer`:
    [(fused operator names, width, depth, n_head or None)], width operators first. Raises
    GrowlmError naming the operator and the constraint when a step cannot be taken."""
    s = shape
    names = chain_names(method)
    if n_embd < s.d:
        raise GrowlmError(f"target width n_embd={n_embd} is smaller than the members' width {s.d}")
    if n_layer < s.L:
        raise GrowlmError(f"target depth n_layer={n_layer} is smaller than the members' depth {s.L}")
    if n_head is not None and (n_head <= 0 or n_embd % n_head):
        raise GrowlmError(f"n_head={n_head} does not divide the target width {n_embd}")
    names = sorted((nm for nm in names if OPERATORS[nm].axis != REFINE), key=lambda nm: _AXIS_ORDER[OPERATORS[nm].axis])
    steps, i = [], 0
    cur, cur_n = s, n
    while i < len(names):
        name = names[i]
        spec = OPERATORS[name]
        fused = [name]
        if i + 1 < len(names) and names[i + 1] in spec.absorbs:
            fused.append(names[i + 1])
            i += 1
        later = names[i + 1:]
        later_w = any(OPERATORS[o].axis in ("width", "both") for o in later)
        later_d = any(OPERATORS[o].axis in ("depth", "both") for o in later)
        natural = spec.natural(cur, cur_n) if spec.natural and len(fused) == 1 else None
        if spec.axis == "width":
            if later_w and natural is None:
                raise GrowlmError(f"chain {names}: two width operators ({name} then "
                                  f"{[o for o in later if OPERATORS[o].axis != 'depth'][0]}) and {name} has no "
                                  f"natural intermediate width")
            tw, tl = (natural[0] if later_w else n_embd), cur.L
        elif spec.axis == "depth":
            if later_d and natural is None:
                raise GrowlmError(f"chain {names}: two depth operators and {name} has no natural intermediate depth")
            tw, tl = cur.d, (natural[1] if later_d else n_layer)
        else:
            if later_w:
                raise GrowlmError(f"chain {names}: {name} grows width and depth, so it must come after the "
                                  f"width operators")
            tw, tl = n_embd, (cur.L if later_d else n_layer)
        hd = n_head if tw == n_embd else None
        if spec.check is not None:
            try:
                spec.check(cur, cur_n, tw, tl, hd, absorbed=tuple(fused[1:]))
            except GrowlmError as err:
                raise GrowlmError(f"{'+'.join(fused)}: {err}") from None
        steps.append((fused, tw, tl, hd))
        h = hd if hd is not None else (tw // cur.dh if tw % cur.dh == 0 else cur.h)
        cur = cur.resized(n_embd=tw, n_layer=tl, n_head=h)
        if spec.multi:
            cur_n = 1
        i += 1
    if (cur.d, cur.L) != (n_embd, n_layer):
        what = []
        if cur.L != n_layer:
            what.append(f"depth {cur.L} instead of {n_layer} (add a depth operator, e.g. "
                        f"{names + ['zero_block']})")
        if cur.d != n_embd:
            what.append(f"width {cur.d} instead of {n_embd} (add a width operator, e.g. "
                        f"{['hyperclone'] + names})")
        raise GrowlmError(f"growth method {names if len(names) > 1 else names[0]!r} reaches "
                          + " and ".join(what))
    return steps


def chain_options(names: list[str]) -> dict:
    """The options the operators of a chain take together, with their defaults (the first wins)."""
    out: dict = {}
    for name in names:
        for key, value in OPERATORS[name].options.items():
            out.setdefault(key, value)
    return out


def check_options(names: list[str], options: dict) -> None:
    """Raise GrowlmError naming an option no operator of the chain takes, and what they take."""
    accepted = chain_options(names)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise GrowlmError(f"option(s) {', '.join(unknown)} not taken by {'+'.join(names)}; they take: "
                          + "; ".join(f"{nm}: {', '.join(OPERATORS[nm].options) or '-'}" for nm in names))
