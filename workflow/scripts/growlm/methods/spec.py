"""What a description of a growth operator, refinement operator or schedule is: `OperatorSpec`, and the
names every description shares (the axes, the grow job's needs, the default shares of a refinement).

Torch-free, like all of `growlm.methods`. An operator is described once, by an `OperatorSpec` in
`OPERATORS` (the built-in ones in `growlm.methods.builtin`, a plugin's by `register_spec`):

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

A *schedule* (axis "schedule": `vcycle`, `apollo`) is described by an `OperatorSpec` too: a training schedule that
stands alone in the method list and reuses no small model. Its `options` are its config section's keys
with their defaults (the section is named after it: `vcycle:`); `settings(config, model=, seed=,
reference=, lr=, train=)` gives its grow job's params from the config (`growlm.experiment.
schedule_settings` resolves what every schedule shares: the model, the shortest budget, the large arms'
first rate, their training settings at that budget); `check(config, sweep, heads_per_kv=)` returns the
problems of a sweep it cannot run (`growlm.validate`). Its implementation is registered under its name
in `growlm.schedules` (torch), which the grow job dispatches to; options `final_share`/`final_warmup` are
the refinement after it (`growlm.recipes.refine_recipe`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable


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
REFINE = "refine"  # the axis of the refinement operators (teach, freeze, carry)


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
    # the model families it works on (growlm.families); None: every family, those registered later included
    families: tuple[str, ...] | None = None
    # a refinement operator whose `loss` replaces the step's LM loss (teach's distillation): a chain holds at
    # most one, since a step minimises one loss (`chain_names`)
    owns_loss: bool = False
    settings: Callable | None = None  # a schedule: its grow job's params from the config (module docstring)
    needs: tuple[str, ...] = ()  # a refinement operator's needs from the grow job (names of GROW_NEEDS)

    def __post_init__(self):
        if self.families is not None:  # as a decorator may give it: a list, or empty for every family
            object.__setattr__(self, "families", tuple(self.families) or None)

    def works_on(self, family: str) -> bool:
        """Whether the operator grows models of `family` (every family unless `families` says which)."""
        return self.families is None or family in self.families

    @property
    def kind(self) -> str:
        return "combine" if self.multi else self.axis
