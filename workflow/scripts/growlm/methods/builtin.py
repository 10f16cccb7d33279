"""The built-in descriptions: every growth operator, refinement operator and schedule growlm ships, with
their constraints (`check`) and the schedules' settings; `OPERATORS`, the registry they start, to
which plugins add theirs (`register_spec`).

Torch-free, like all of `growlm.methods`: the workflow checks every chain of a sweep with these
constraints while Snakemake parses the Snakefile. Each entry's `summary` is its cell in the tables of
docs/methods.md (`growlm.methods.tables`).
"""

from __future__ import annotations

from typing import Callable

from growlm.errors import GrowlmError
from growlm.methods.spec import GROW_NEEDS, REFINE, SCHEDULE, OperatorSpec
from growlm.shape import ModelShape
from growlm.train_config import WSD_FIELDS


# ----------------------------------------------------------------------------------------------
# the operators' constraints
# ----------------------------------------------------------------------------------------------

# operators that grow to a head count that is not whole groups of the source's query heads per key/value head
# by duplicating key/value heads (growlm.growth.width.regrouped_heads), exactly
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
    # the stages keep their authors' cosine whatever the large arms' schedule (growlm.recipes): not read here
    settings = {k: v for k, v in train(seed + 104729).items() if k not in ("schedule", *WSD_FIELDS)}
    return {"vcycle": stages, "train": settings, "model": model,
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
