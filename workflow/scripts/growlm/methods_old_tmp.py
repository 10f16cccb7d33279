"""The growth methods a config may name: one description per operator, and the chains built from them.

This module is torch-free on purpose: the workflow imports it while Snakemake parses the Snakefile
(at every `snakemake` start and, on SLURM, in every job), and checks every growth chain of the sweep
here, with each operator's own constraints and option names, before any job runs.

An operator is described once, by an `OperatorSpec` in `OPERATORS`:

* `axis`: what it grows ("width", "depth" or "both"); `multi`: it combines all n members (else it
  uses m_1 alone); `kind` follows from the two ("combine" for a multi-member operator). Axis
  "refine" marks the three *refinement operators*, which grow nothing but change how M'_1 is
  refined when they stand in a chain: `teach` (the members as teachers: a KL term towards their
  logit-average ensemble, decaying to zero), `freeze` (the inherited weights frozen for a first
  phase while the new ones train) and `carry` (AdamW starts from the members' grown moments). So
  `[msg, teach]` and `[msg]` are two arms of one sweep;
* `exact`: the grown model computes exactly what the source did before training (for `concat`: the
  members' logit average);
* `learned`: its growth map is trained (its cost is counted; it is not affine in the weights, so the
  members' optimizer moments cannot be carried over);
* `ramps`: options that are lengths, in refinement steps, of a mask ramp that must end within the
  refinement (the grow job sets them to a fifth of the shortest refinement unless configured);
* `options`: the keyword options with their defaults (the implementation's signature must say the
  same: `growlm.growth.registry.implements` checks it at import);
* `needs` (a refinement operator): what it needs from the grow job, names of `GROW_NEEDS` (`carry` the
  members' grown moments, `freeze` the masks of the inherited entries); the grow job provides each need
  of the chain's refiners (`growlm.jobs.grow.PROVIDERS`) and the record names what it wrote;
* `check(shape, n, n_embd, n_layer, n_head, absorbed)`: raises GrowlmError when the operator cannot
  grow n members of `shape` to that size; `natural(shape, n)`: the size a combining operator reaches
  by itself, for chains; `absorbs`: operators that, following this one in a chain, are fused into it.

The implementations live in `growlm.growth` (torch).

A *schedule* (axis "schedule": `vcycle`, `apollo`) is described here too: a training schedule that
stands alone in the method list and reuses no small model. Its `options` are its config section's keys
with their defaults (the section is named after it: `vcycle:`); `settings(config, model=, seed=,
reference=, lr=, train=)` gives its grow job's params from the config (`growlm.experiment.
schedule_settings` resolves what every schedule shares: the model, the shortest budget, the large arms'
first rate, their training settings at that budget); `check(config, sweep, heads_per_kv=)` returns the
problems of a sweep it cannot run (`growlm.validate`). Its implementation is registered under its name
in `growlm.schedules` (torch), which the grow job dispatches to; options `final_share`/`final_warmup` are
the refinement after it (`growlm.recipes.refine_recipe`).
`method_table()` renders the operator tables of docs/methods.md from these descriptions (each
operator's `summary` is its table cell; docs/tables.py writes them, tests/test_docs.py compares).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

from growlm.errors import GrowlmError
from growlm.shape import FAMILIES, ModelShape

# what a refinement operator may need from the grow job (`OperatorSpec.needs`), in the order the grow job
# provides them. Each is computed from the linear part of the chain's growth operators, so a chain with a
# learned operator (not affine in the members' weights) cannot provide it.
GROW_NEEDS = {
    "moments": "the members' final AdamW moments grown by the operator's linear part (growlm.growth.moments)",
    "inherited": "masks of the entries inherited from the members: the non-zero entries of the operator's linear "
                 "part",
}
SCHEDULE = "schedule"  # the axis of the training schedules that reuse no small model (vcycle, apollo)
SINGLE_MEMBER = "@m1"  # suffix of the control arm: the same operator fed m_1 alone (n copies)
# a ramp's or a refinement operator's step count unless configured: this share of the shortest refinement
REFINE_SHARE = Fraction(1, 5)
# a learned operator's training steps unless configured: this share of the shortest refinement, at
# least LEARNED_MIN_STEPS (growlm.recipes: the authors' share does not carry to small runs)
LEARNED_SHARE = Fraction(1, 20)
LEARNED_MIN_STEPS = 10


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    axis: str  # "width" | "depth" | "both"
    exact: bool
    multi: bool = False
    learned: bool = False
    ramps: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)
    check: Callable | None = None
    natural: Callable | None = None
    absorbs: tuple[str, ...] = ()
    summary: str = ""
    source: str = "growlm"  # "growlm" for the built-in operators, else the plugin file that declared it
    families: tuple[str, ...] = FAMILIES  # the model families it works on (growlm.families)
    # a refinement operator whose `loss` replaces the step's LM loss (teach's distillation): a chain holds at
    # most one, since a step minimises one loss (`chain_names`)
    owns_loss: bool = False
    settings: Callable | None = None  # a schedule: its grow job's params from the config (module docstring)
    needs: tuple[str, ...] = ()  # a refinement operator's needs from the grow job (names of GROW_NEEDS)

    @property
    def kind(self) -> str:
        return "combine" if self.multi else self.axis


# ----------------------------------------------------------------------------------------------
# the operators' constraints
# ----------------------------------------------------------------------------------------------

# operators that grow to a head count that is not whole groups of the source's query heads per key/value head
# by duplicating key/value heads (growlm.growth.algebra.regrouped_heads), exactly
REGROUPS = ("lemon", "net2net", "fpi", "aki", "msg")


def check_heads(s: ModelShape, n_embd: int, n_head: int | None, what: str, regroup: bool = False) -> int:
    """Head count of the grown model when the head size is kept (heads are copied whole). `regroup`: the
    operator duplicates key/value heads where the heads are not whole groups of s.r (`REGROUPS`)."""
    if n_embd % s.dh:
        raise GrowlmError(f"{what}: width {n_embd} is not a multiple of the head size {s.dh} "
                          f"(heads are copied whole, so the head size is kept)")
    h1 = n_embd // s.dh
    if n_head is not None and n_head != h1:
        raise GrowlmError(f"{what}: n_head={n_head} would change the head size {s.dh}; "
                          f"this operator keeps it (n_head={h1} for width {n_embd})")
    if h1 % s.r and not regroup:  # grouped-query attention: heads grown in whole groups sharing a key/value head
        step = s.dh * s.r
        raise GrowlmError(f"{what}: width {n_embd} gives {h1} heads, not whole groups of {s.r} query heads per "
                          f"key/value head; use a width that is a multiple of {step} (head size x {s.r}), or an "
                          f"operator that duplicates key/value heads for such widths ({', '.join(REGROUPS)})")
    return h1


def _keeps_heads(name: str) -> Callable:
    def check(s, n, n_embd, n_layer, n_head, absorbed=()):
        check_heads(s, n_embd, n_head, name, regroup=name in REGROUPS)
    return check


def _hyperclone(s, n, n_embd, n_layer, n_head, absorbed=()):
    if n_embd % s.d:
        raise GrowlmError(f"hyperclone needs the width {n_embd} to be a multiple of the source width {s.d} "
                          f"(k = d1/d0 must be an integer); use 'lemon' for other widths")
    check_heads(s, n_embd, n_head, "hyperclone")


def _keeps_width(name: str) -> Callable:
    def check(s, n, n_embd, n_layer, n_head, absorbed=()):
        if n_embd != s.d:
            raise GrowlmError(f"{name} keeps the width ({s.d}), but width {n_embd} was asked; "
                              f"chain a width operator before it, e.g. ['hyperclone', '{name}']")
        if n_head is not None and n_head != s.h:
            raise GrowlmError(f"{name} keeps the heads ({s.h}), but n_head={n_head} was asked")
    return check


def _stack_members(s, n, n_embd, n_layer, n_head, absorbed=()):
    _keeps_width("stack_members")(s, n, n_embd, n_layer, n_head)
    if n_layer != n * s.L:
        raise GrowlmError(f"stack_members puts the {n} members' {s.L} blocks one after another "
                          f"(depth {n * s.L}), but depth {n_layer} was asked; chain a depth operator "
                          f"after it, e.g. ['stack_members', 'zero_block']")


def _msg_members(s, n, n_embd, n_layer, n_head, absorbed=()):
    check_heads(s, n_embd, n_head, "msg_members")
    if n_embd < n * s.d:
        raise GrowlmError(f"msg_members places m_2..m_{n} beside m_1 in the new capacity, so {n} members of width "
                          f"{s.d} need width >= {n * s.d}, not {n_embd}")


def _merge(s, n, n_embd, n_layer, n_head, absorbed=()):
    _keeps_width("merge")(s, n, n_embd, n_layer, n_head)
    if n_layer != s.L:
        raise GrowlmError(f"merge keeps the depth ({s.L}), but depth {n_layer} was asked; chain a growth operator "
                          f"after it, e.g. ['merge', 'msg']")


def _concat(s, n, n_embd, n_layer, n_head, absorbed=()):
    check_heads(s, n_embd, n_head, "concat")
    if n_embd < n * s.d:
        raise GrowlmError(f"concat of {n} members of width {s.d} needs width >= {n * s.d}, not {n_embd}")
    if n_embd != n * s.d and "lemon" not in absorbed:
        raise GrowlmError(f"concat puts {n} members of width {s.d} side by side (width {n * s.d}), but width "
                          f"{n_embd} was asked; for other widths use the chain ['concat', 'lemon']")


def _vcycle_settings(config: dict, *, model: dict, seed: int, reference: int, lr: float, train: Callable) -> dict:
    """The V-cycle's grow job: its stages are shares of the reference budget's steps at the large arms'
    rate (`train(seed)`: their settings there); `final_share`/`final_warmup` are the refinement's."""
    stages = {k: v for k, v in config["vcycle"].items() if k not in ("final_share", "final_warmup")}
    return {"vcycle": stages, "train": train(seed + 104729), "model": model,
            "memory_limit_gb": config["resources"]["memory_limit_gb"]}


def _vcycle_check(config: dict, sweep: dict, *, heads_per_kv: int) -> list[str]:
    """Every level of the V must be whole heads (in whole key/value groups), and the last stage (the
    refinement) at least one batch."""
    out, vc, head_dim, r = [], config["vcycle"], config["model"]["head_dim"], heads_per_kv
    k, levels = vc["factor"], vc["levels"]
    total = k ** (levels - 1)  # the coarsest level is total times narrower and shallower
    for d1 in sweep["d1"]:
        for L1 in sweep["L1"]:
            if d1 % total or L1 % total or (d1 // total) % (head_dim * r):
                out.append(f"vcycle: {levels} levels by factor {k} need d1 = {d1} and L1 = {L1} divisible by {total} "
                           f"into whole heads of {head_dim} (in groups of {r} per key/value head); use fewer levels "
                           f"or a factor that divides both")
    batch = (config["train"].get("refine") or {}).get("batch_size", config["train"]["large"]["batch_size"])
    one = batch * config["model"]["context"]
    for budget in sweep["budgets"]:
        if vc["final_share"] * budget < one:
            out.append(f"vcycle.final_share = {vc['final_share']}: the last stage of budget {budget} would be "
                       f"shorter than one batch ({one} tokens)")
    return out


def _apollo_settings(config: dict, *, model: dict, seed: int, reference: int, lr: float, train: Callable) -> dict:
    """The Apollo-style control's grow job: its schedule a share of the reference budget (the shortest of
    the sweep), at the large arms' first rate, warmed up over 2.5% of M_0's steps there (the authors)."""
    ap, t = config["apollo"], config["train"]
    batch, context = int(t["large"]["batch_size"]), int(config["model"]["context"])
    schedule = {"tokens": int(ap.get("tokens") or round(float(ap["share"]) * reference)),
                "stages": ap["stages"], "lr": float(ap.get("lr") or lr),
                "warmup_steps": int(ap["warmup_steps"] if ap.get("warmup_steps") is not None
                                    else max(1, round(0.025 * reference / (batch * context))))}
    return {"apollo": schedule, "model": model, "batch_size": batch, "context": context,
            "weight_decay": float(t["weight_decay"]), "grad_clip": float(t["grad_clip"])}


_NOISY_COPY = {"noise": 0.0, "mapping": "random"}
_LEARNED = {"steps": 100, "batches": None, "lr": 1e-3, "init_noise": 0.01, "device": None}

OPERATORS: dict[str, OperatorSpec] = {spec.name: spec for spec in [
    OperatorSpec("hyperclone", "width", exact=True, options={"noise": 0.316}, check=_hyperclone,
                 summary="width x k for an integer k = d1/d0 (heads x k, head size kept), optional cancelling "
                         "noise"),
    OperatorSpec("lemon", "both", exact=True, check=_keeps_heads("lemon"),
                 options={"noise": 0.1, "residue_std": 0.02, "position": "interleave"},
                 summary="width and depth to any size (mean padding, unequal splits, LN gain/eps rescaled)"),
    OperatorSpec("net2net", "width", exact=False, options=dict(_NOISY_COPY), check=_keeps_heads("net2net"),
                 summary="Net2Net width (random copy map); exact only with even copy counts (`mapping: cyclic`, "
                         "d1 a multiple of d0)"),
    OperatorSpec("fpi", "both", exact=False, options=dict(_NOISY_COPY), check=_keeps_heads("fpi"),
                 summary="bert2BERT function-preserving init: Net2Net width (random copy map), then stacking "
                         "(1..L, 1..L) for depth"),
    OperatorSpec("aki", "both", exact=False, options=dict(_NOISY_COPY), check=_keeps_heads("aki"),
                 summary="bert2BERT advanced knowledge init: FPI, but the new output units of layer l come from "
                         "layer l+1 (not function-preserving by design), then stacking for depth"),
    OperatorSpec("zero_block", "depth", exact=True, options={"position": "interleave"},
                 check=_keeps_width("zero_block"), summary="new blocks with zero output projections"),
    OperatorSpec("stack", "depth", exact=False, check=_keeps_width("stack"),
                 summary="G_stack (1..L, 1..L)"),
    OperatorSpec("interleave", "depth", exact=False, check=_keeps_width("interleave"),
                 summary="every block duplicated in place (1,1,2,2,...)"),
    OperatorSpec("msg", "both", exact=True, ramps=("ramp_steps",), check=_keeps_heads("msg"),
                 options={"ramp_steps": 100, "position": "interleave", "init_std": None},
                 summary="Masked Structural Growth: new units/heads/blocks masked in over `ramp_steps`"),
    OperatorSpec("concat", "width", exact=True, multi=True, ramps=("ramp_steps", "ln_ramp_steps"),
                 check=_concat, natural=lambda s, n: (n * s.d, s.L), absorbs=("lemon",),
                 options={"cross": "zero", "cross_std": None, "ramp_steps": 100, "ln_ramp_steps": 100,
                          "noise": 0.1, "residue_std": 0.02},
                 summary="the n members side by side (d1 = n d0), per-member LayerNorm faded into full "
                         "LayerNorm; exact: the members' logit average"),
    OperatorSpec("stack_members", "depth", exact=False, multi=True, options={"embed": "mean"},
                 check=_stack_members, natural=lambda s, n: (s.d, n * s.L),
                 summary="the members' blocks one after another"),
    OperatorSpec("msg_members", "both", exact=True, multi=True, ramps=("ramp_steps",), check=_msg_members,
                 options={"ramp_steps": 100, "position": "interleave", "init_std": None, "cross": "random"},
                 summary="`msg` of m_1 with m_2..m_n placed block-diagonally in the new capacity (needs "
                         "n d0 <= d1), masked in; exact: m_1"),
    OperatorSpec("merge", "width", exact=False, multi=True, check=_merge, natural=lambda s, n: (s.d, s.L),
                 options={"align": "weights", "iterations": 5},
                 summary="the members averaged into one model of their size after weight matching "
                         "(`align: weights`; `none` averages as they stand); chain it: `[merge, msg]`"),
    OperatorSpec("teach", "refine", exact=True, multi=True, ramps=("teach_steps",), owns_loss=True,
                 options={"teach_weight": 0.5, "temperature": 2.0, "teach_steps": 100},
                 summary="the loss is (1 - w) CE + w T^2 KL(members' logit average || M_1) for the first "
                         "`teach_steps` steps, w decaying linearly from `teach_weight` to 0 (T: `temperature`); "
                         "then the members are no longer run"),
    OperatorSpec("freeze", "refine", exact=True, ramps=("freeze_steps",), options={"freeze_steps": 100},
                 needs=("inherited",),
                 summary="the entries inherited from the members (those the operator copies, splits or "
                         "averages; found as the non-zero entries of the operator's linear part) are held fixed "
                         "for `freeze_steps` while the new ones train"),
    OperatorSpec("carry", "refine", exact=True, options={}, needs=("moments",),
                 summary="AdamW starts from the members' final moments grown by the linear part of the same "
                         "operator (`growlm.growth.moments`; not for the learned operators)"),
    OperatorSpec("vcycle", SCHEDULE, exact=False, settings=_vcycle_settings, check=_vcycle_check,
                 options={"levels": 2, "factor": 2, "pairing": "stride", "stage_share": 0.05, "coarse_share": 0.5,
                          "lr_multiplier": 4, "alpha": 0.5, "embeddings": "mean", "final_share": 0.5,
                          "final_warmup": 0},
                 summary="Multi-Level V-cycle schedule: train the large model briefly, coalesce it, train the coarse "
                         "model, de-coalesce and interpolate with the weights from before coalescing, train the "
                         "large model again ([below](#each-method-as-its-authors-run-it))"),
    OperatorSpec("apollo", SCHEDULE, exact=False, settings=_apollo_settings,
                 options={"share": 0.25, "tokens": None, "stages": "authors", "final_share": 0.75, "final_warmup": 0,
                          "lr": None, "warmup_steps": None},
                 summary="control that reuses no small model: M_0's init trained Apollo-style (shared layers, depth "
                         "sampled with p ~ 1/depth, stages of 1, 2, 4, ... unique blocks, duplicated exactly between "
                         "stages) for `apollo.share` of the budget (cost counted), then refined"),
    OperatorSpec("ligo", "both", exact=False, multi=True, learned=True, options=dict(_LEARNED),
                 check=_keeps_heads("learned growth"),
                 summary="LiGO: learned linear growth maps (width maps and depth mixing, rank-1 ring), trained "
                         "`steps` steps on level-1 batches, then materialised"),
    OperatorSpec("mango", "both", exact=False, multi=True, learned=True, options={"rank": 2, **_LEARNED},
                 check=_keeps_heads("learned growth"),
                 summary="Mango: learned tensor-ring growth maps of bond rank `rank` (rank 1 = LiGO), trained "
                         "`steps` steps on level-1 batches, then materialised"),
]}


def methods() -> list[str]:
    """The sorted names of every operator (built-in and registered by plugins); the schedules are not
    operators (`schedules()`)."""
    return sorted(name for name, spec in OPERATORS.items() if spec.axis != SCHEDULE)


def schedules() -> list[str]:
    """The names of the training schedules that reuse no small model, in their description's order."""
    return [name for name, spec in OPERATORS.items() if spec.axis == SCHEDULE]


METHODS: list[str] = methods()  # the built-in operators (plugins add to OPERATORS)


def register_spec(spec: OperatorSpec) -> OperatorSpec:
    """Add an operator's description (plugins); a name may be described once, except that a plugin
    file's own description (read without running it, `growlm.plugins.describe`) is replaced by the
    one its decorator gives when the file is imported."""
    known = OPERATORS.get(spec.name)
    if known is not None and known.source == spec.source and known.source != "growlm":
        OPERATORS[spec.name] = spec
        return spec
    if spec.name in OPERATORS:
        raise GrowlmError(f"growth operator {spec.name!r} is described twice ({OPERATORS[spec.name].source} "
                          f"and {spec.source})")
    if spec.axis not in ("width", "depth", "both", REFINE):
        raise GrowlmError(f"growth operator {spec.name!r} ({spec.source}): axis must be width, depth or both (or "
                          f"{REFINE} for a refinement operator), not {spec.axis!r}")
    unknown = [need for need in spec.needs if need not in GROW_NEEDS]
    if spec.axis != REFINE and spec.needs or unknown:
        raise GrowlmError(f"growth operator {spec.name!r} ({spec.source}): needs {list(spec.needs)}: a refinement "
                          f"operator may need {', '.join(GROW_NEEDS)} from the grow job")
    if spec.ramps and not set(spec.ramps) <= set(spec.options):
        raise GrowlmError(f"growth operator {spec.name!r} ({spec.source}): ramps {list(spec.ramps)} must name "
                          f"keyword options of the function (it has {', '.join(spec.options) or 'none'})")
    OPERATORS[spec.name] = spec
    return spec


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


REFINE = "refine"  # the axis of the refinement operators (teach, freeze, carry)


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


# ----------------------------------------------------------------------------------------------
# the operator tables of docs/methods.md, rendered from the descriptions (docs/tables.py writes them)
# ----------------------------------------------------------------------------------------------

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
    if tuple(spec.families) != FAMILIES:
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
