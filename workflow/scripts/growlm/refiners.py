"""Refiners: what a refinement operator adds to the training loop, described once and registered.

A refinement operator (`teach`, `freeze`, `carry`; axis "refine" in `growlm.methods.OPERATORS`, where
its options and their defaults are described) grows nothing: standing in a method's chain
(`[msg, teach]`) it changes how M'_1 is refined. Its implementation is a `Refiner`, registered here
under the same name (`refiner(name)` checks its options against the description, as
`growlm.growth.registry.implements` does for growth operators); a plugin file may define one with
`growlm.growth.register_operator(name, axis="refine", ...)` on a Refiner subclass. The training loop
(`growlm.train`) knows nothing about any of them; it calls, for every refiner of the run:

* `setup(run)` once, after the model, the optimizer and any resumed checkpoint exist, and
  `start(run)` only when the run starts at step 0 (not on a resume);
* `loss(run, step, x, y)` for each micro-batch: a loss to use instead of the plain LM loss, or None
  (the plain loss that step). A refiner that overrides it owns the loss, and a chain holds at most one
  such refiner (`OperatorSpec.owns_loss`, checked before any job): a step minimises one loss, and the
  ledger counts what each refiner's `flops` says it ran;
* `before_step(step)` after the backward pass and before clipping and AdamW, `after_step(step)` after;
* `flops(steps, tokens_per_step)`: the FLOPs it has added over the first `steps` steps (the ledger and
  the cost ratio count them);
* `state()`: what it keeps in a checkpoint (a JSON-able dict; `load(state)` on a resume).

Its settings are `TrainConfig.refiners[name]`: its options (resolved by `growlm.experiment`, step
counts a share of the shortest refinement unless configured) and the files the refine job gives it
(`inputs`: teachers' model folders, the inherited-entry masks, the carried moments), which are part
of the run's identity (`identify`, gathered by `growlm.runner.identify_inputs`). A file the grow job
must write for it is one of its description's `needs` (`growlm.methods.GROW_NEEDS`): the grow job
provides each need of the chain's refiners and names the file in its record (`Growth.provided[need]`),
so neither the grow job nor the chain check names a refiner.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file

from growlm import hints
from growlm.console import log
from growlm.errors import GrowlmError, digest
from growlm.flops import model_forward_flops_per_token
from growlm.growth_record import GROWTH_FILE, Growth
from growlm.loss import distill_loss
from growlm.methods import OPERATORS, OperatorSpec, register_spec
from growlm.model import load_model
from growlm.optim_state import apply_moments

REFINERS: dict[str, type] = {}


class Refiner:
    """The interface (see the module docstring); every method does nothing by default."""

    name = ""
    inputs: tuple[str, ...] = ()  # settings that are files the job gives it, not options

    @classmethod
    def settings(cls, options: dict, *, growth: Growth, grown_dir: Path, steps: int) -> dict:
        """The keyword arguments of the refiner for one refinement of `steps` steps: its `options`,
        its step counts (the description's `ramps`) held within the refinement, and - for a refiner
        with `inputs` - the files the grow job left for it, found in `growth` (the grow job's record,
        `growlm.growth_record.Growth`) and `grown_dir`."""
        kw = dict(options)
        for key in OPERATORS[cls.name].ramps:
            kw[key] = min(int(kw[key]), steps)
        return kw

    @classmethod
    def identify(cls, settings: dict) -> dict[str, str]:
        """{what: sha256} of the files among `settings` (its `inputs`: a file, a model folder, or a list
        of them), part of the run's identity: a checkpoint made with other files is never resumed."""
        out = {}
        for key in cls.inputs:
            value = settings.get(key)
            values = value if isinstance(value, (list, tuple)) else [value]
            for i, v in enumerate(x for x in values if x):
                path = Path(v) / "model.safetensors" if Path(v).is_dir() else Path(v)
                out[f"{cls.name} {key}" + (f" {i + 1}" if isinstance(value, (list, tuple)) else "")] = digest(path)
        return out

    def setup(self, run) -> None:
        pass

    def start(self, run) -> None:
        pass

    def loss(self, run, step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        return None

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def flops(self, steps: int, tokens_per_step: int) -> int:
        return 0

    def state(self) -> dict:
        return {}

    def load(self, state: dict) -> None:
        pass


def options_of(cls: type) -> dict:
    """A refiner's options: the keyword-only parameters of its __init__ but its `inputs`, with defaults."""
    out = {}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in cls.inputs:
            out[p.name] = None if p.default is inspect.Parameter.empty else p.default
    return out


def refiner(name: str) -> Callable[[type], type]:
    """Class decorator: register a Refiner as the implementation of refinement operator `name`, whose
    options must be its description's (`growlm.methods.OPERATORS[name]`, axis "refine")."""

    def wrap(cls: type) -> type:
        spec = OPERATORS.get(name)
        if spec is None or spec.axis != "refine":
            raise GrowlmError(f"{cls.__name__} implements {name!r}, which is not a described refinement operator")
        if options_of(cls) != spec.options:
            raise GrowlmError(f"refinement operator {name!r}: the implementation's options {options_of(cls)} differ "
                              f"from its description {spec.options}")
        cls.name = name
        REFINERS[name] = cls
        return cls

    return wrap


def register_refiner(name: str, cls: type, *, multi: bool = False, ramps: tuple[str, ...] = (),
                     families: tuple[str, ...] | None = None, needs: tuple[str, ...] = (), source: str = "") -> type:
    """Describe and implement a refinement operator at once (`growlm.growth.register_operator(name,
    axis="refine")` on a Refiner subclass, in a plugin file): its options are the keyword-only
    parameters of its __init__ but its `inputs`; its summary the first line of its docstring.
    `ramps`: options that are step counts (held within the refinement; a share of it by default in
    the workflow); `multi`: it uses all n members; `needs`: what it needs from the grow job
    (`growlm.methods.GROW_NEEDS`), which it then finds in `growth.provided`."""
    if not (inspect.isclass(cls) and issubclass(cls, Refiner)):
        raise GrowlmError(f"refinement operator {name!r}: register a subclass of growlm.refiners.Refiner, not "
                          f"{getattr(cls, '__name__', cls)!r}")
    doc = (cls.__doc__ or "").strip().splitlines()
    register_spec(OperatorSpec(name, "refine", exact=True, multi=multi, ramps=tuple(ramps), options=options_of(cls),
                               owns_loss=cls.loss is not Refiner.loss, needs=tuple(needs),
                               summary=doc[0] if doc else "", source=source,
                               families=families))
    REFINERS.pop(name, None)  # a plugin file imported again registers its class again
    return refiner(name)(cls)


def build(settings: dict | None) -> list[Refiner]:
    """The refiners of a run from `TrainConfig.refiners` ({name: settings}), in a fixed order; at most
    one of them owns the loss (its class overrides `loss`: the workflow refuses such chains before any
    job, `growlm.methods.chain_names`, and a run given one anyway stops here)."""
    out = []
    for name, kw in sorted((settings or {}).items()):
        if name not in REFINERS:
            raise GrowlmError(f"unknown refinement operator {name!r} (known: {', '.join(sorted(REFINERS))})")
        out.append(REFINERS[name](**kw))
    owners = [r.name for r in out if type(r).loss is not Refiner.loss]
    if len(owners) > 1:
        raise GrowlmError(f"refinement operators {' and '.join(owners)} each replace the training loss; a step "
                          f"minimises one loss: keep one of them")
    return out


@refiner("teach")
class Teach(Refiner):
    """The members as teachers: for the first `teach_steps` steps the loss is
    (1 - w) CE + w T^2 KL(members' logit average || M_1) (`growlm.loss.distill_loss`), w decaying
    linearly from `teach_weight` to 0; then the members are no longer run. Their forward FLOPs count."""

    inputs = ("teachers",)

    def __init__(self, *, teach_weight: float = 0.5, temperature: float = 2.0, teach_steps: int = 100,
                 teachers: tuple = ()):
        if not teachers or not 0 < teach_weight <= 1 or temperature <= 0:
            raise GrowlmError(f"teaching needs teachers, a weight in (0, 1] and a positive temperature (got "
                              f"{len(teachers)} teachers, weight {teach_weight}, temperature {temperature})")
        self.weight0, self.temperature, self.steps = float(teach_weight), float(temperature), int(teach_steps)
        self.dirs = list(teachers)
        self.models, self.per_token = [], 0

    @classmethod
    def settings(cls, options, *, growth, grown_dir, steps):
        kw = super().settings(options, growth=growth, grown_dir=grown_dir, steps=steps)
        teachers = list(dict.fromkeys(m["dir"] for m in growth.members if m.get("role") != "trunk"))
        if not teachers:
            raise GrowlmError(f"teach: {grown_dir}/{GROWTH_FILE} names no members to teach")
        log(f"teach: {len(teachers)} member(s) teach for {kw['teach_steps']} steps (weight {kw['teach_weight']} "
            f"-> 0, temperature {kw['temperature']})")
        return {**kw, "teachers": teachers}

    @classmethod
    def identify(cls, settings):
        return {f"teacher {i + 1}": digest(Path(t) / "model.safetensors") for i, t in enumerate(settings["teachers"])}

    def setup(self, run) -> None:
        self.models = [load_model(d).to(run.device).eval() for d in self.dirs]
        for m in self.models:
            m.requires_grad_(False)
        self.per_token = sum(model_forward_flops_per_token(m.config, run.cfg.context) for m in self.models)

    def weight(self, step: int) -> float:
        return 0.0 if step >= self.steps else self.weight0 * (1.0 - step / self.steps)

    def loss(self, run, step, x, y):
        w = self.weight(step)
        if w <= 0:
            return None
        student = run.step_model(input_ids=x).logits
        with torch.no_grad():
            teacher = sum(m(input_ids=x).logits.float() for m in self.models) / len(self.models)
        return distill_loss(student, y, teacher, weight=w, temperature=self.temperature)

    def flops(self, steps, tokens_per_step):
        return min(steps, self.steps) * tokens_per_step * self.per_token


@refiner("freeze")
class Freeze(Refiner):
    """The inherited entries held at their grown values for the first `freeze_steps` steps: their
    gradients are zeroed before the optimizer step (so AdamW's moments stay zero there) and their values
    put back after it (AdamW's decoupled weight decay would move them otherwise); the new entries train.
    Works with one process or DDP, not with FSDP's sharded parameters."""

    inputs = ("masks",)

    def __init__(self, *, freeze_steps: int = 100, masks: str | None = None):
        if not masks:
            raise GrowlmError(f"freezing for {freeze_steps} steps needs the inherited-entry masks")
        self.steps, self.masks, self.items = int(freeze_steps), masks, []

    @classmethod
    def settings(cls, options, *, growth, grown_dir, steps):
        kw = super().settings(options, growth=growth, grown_dir=grown_dir, steps=steps)
        masks = Path(grown_dir) / growth.provided.get("inherited", "inherited.safetensors")  # its need
        if not masks.is_file():
            raise GrowlmError(f"freeze: {masks} is missing (the grow job writes it for methods with freeze); "
                              f"rebuild it and continue with `{hints.rebuild(masks)}`")
        log(f"freeze: inherited weights held for {kw['freeze_steps']} steps")
        return {**kw, "masks": str(masks)}

    @classmethod
    def identify(cls, settings):
        return {"frozen entries": digest(settings["masks"])}

    def setup(self, run) -> None:
        if run.cfg.strategy.startswith("fsdp"):
            raise GrowlmError("freeze (inherited weights held fixed) works with one process or DDP, not with FSDP's "
                              "sharded parameters; drop freeze from the method or give the job more memory")
        if run.start_step >= self.steps:
            return
        masks = load_file(self.masks)
        params = dict(run.core.named_parameters())
        unknown = sorted(set(masks) - set(params))
        if unknown:
            raise GrowlmError(f"{self.masks}: masks for parameters the model does not have: {unknown[:3]}")
        for name, mask in masks.items():
            p = params[name]
            mask = mask.to(device=p.device, dtype=torch.bool)
            if mask.shape != p.shape:
                raise GrowlmError(f"{self.masks}: mask of {name} has shape {tuple(mask.shape)}, the parameter "
                                  f"{tuple(p.shape)}")
            if mask.any():  # (after a resume: the checkpoint's values, which are the grown ones)
                self.items.append((p, mask, p.detach().clone()))

    def before_step(self, step):
        if step < self.steps:
            for p, mask, _ in self.items:
                if p.grad is not None:
                    p.grad.masked_fill_(mask, 0.0)

    @torch.no_grad()
    def after_step(self, step):
        if step < self.steps:
            for p, mask, value in self.items:
                p.copy_(torch.where(mask, value, p))


@refiner("carry")
class Carry(Refiner):
    """AdamW starts from the members' moments grown by the same operator (`growlm.growth.moments`; the
    grow job provides them, its need "moments"), instead of from zero."""

    inputs = ("moments",)

    def __init__(self, *, moments: str | None = None):
        if not moments:
            raise GrowlmError("carry needs the grown moments (the grow job writes them when carry is in the chain)")
        self.moments = moments

    @classmethod
    def settings(cls, options, *, growth, grown_dir, steps):
        if not growth.provided.get("moments"):
            raise GrowlmError(f"carry: {grown_dir}/{GROWTH_FILE} names no grown moments; rebuild it and continue "
                              f"with `{hints.rebuild(Path(grown_dir) / GROWTH_FILE)}`")
        return {**options, "moments": str(Path(grown_dir) / growth.provided["moments"])}

    @classmethod
    def identify(cls, settings):
        return {"carried moments": digest(settings["moments"])}

    def start(self, run) -> None:
        n = apply_moments(run.model, run.optimizer, self.moments)
        run.log(f"AdamW starts from carried-over moments for {n} parameters ({self.moments})")
