"""Jobs of the growth stage: the members -> M'_1 with an operator or chain (`grow`), and the schedules
that stand in the method list but reuse no small model (`grow_schedule`, which runs what
`growlm.schedules` registered under the schedule's name).

Every grow job writes the grown model and its record `growth.json` (`growlm.growth_record.Growth`: the
method, its options, the growth FLOPs and wall time, the members it used with their training cost -
what the comparison counts), both through `finish`, the one place that writes a record.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from growlm.data import BatchSampler
from growlm.errors import GrowlmError, read_json
from growlm.growth import grow as grow_models, save_grown
from growlm.growth.moments import grow_moments, inherited_masks
from growlm.growth_record import Growth
from growlm.console import log
from growlm.methods import OPERATORS, chain_needs, growth_names, members_used, method_chain
from growlm.model import load_model
from growlm.optim_state import GROWN_MOMENTS_FILE, MEMBER_MOMENTS_FILE, load_moments, save_grown_moments
from growlm.profiling.ranges import phase
from growlm.schedules import RUNNERS
from growlm.shape import ModelShape
from growlm.tokens import load_tokens

INHERITED_FILE = "inherited.safetensors"  # bool masks of the inherited entries (need "inherited")


def tokenizer_of(data_file) -> Path | None:
    """The experiment's tokenizer folder, found from a token file the grow job reads (the workflow's layout:
    `<results>/tokens/<level>/train.npy` beside `<results>/tokenizer/`), for the grown model's folder; None
    when there is none (the library used on its own)."""
    if data_file is None:
        return None
    folder = Path(data_file).parents[2] / "tokenizer"
    return folder if (folder / "tokenizer.json").is_file() else None


def operator_options(chain: list[str], options: dict, *, seed: int, data_file=None,
                     learned_batches: dict | None = None) -> dict:
    """The options a grow job passes to `grow()`: the configured ones and, for learned operators,
    their level-1 training batches. (The mask ramps are set by the refinement: `set_ramps`.)"""
    opts = dict(options)
    for name in chain:
        if OPERATORS[name].learned and "batches" not in opts and opts.get("steps", 1):
            sampler = BatchSampler(load_tokens(data_file), batch_size=learned_batches["batch_size"],
                                   context=learned_batches["context"], seed=seed + 7919)
            opts["batches"] = [sampler.batch(i)[0] for i in range(int(opts.get("steps", 100)))]
    return opts


def check_finite(model: torch.nn.Module, method: str, options: dict, data_file=None) -> None:
    """A grown model must hold finite weights and compute finite logits; else the grow job stops,
    naming the operator and the options it was given (nothing is saved)."""
    shown = ", ".join(f"{k}={v!r}" for k, v in options.items() if k != "batches") or "its default options"
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    context = ModelShape.of(getattr(model, "inner", model)).T
    tokens = load_tokens(data_file) if data_file is not None else None
    if not bad and tokens is not None and tokens.size >= context:
        rows = min(2, tokens.size // context)
        x = torch.from_numpy(tokens[: rows * context].astype("int64")).reshape(rows, context)
        with torch.no_grad():
            if not torch.isfinite(model(input_ids=x).logits).all():
                bad = ["its logits on a level-1 batch"]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise GrowlmError(f"{method} with {shown} grew a model with non-finite values ({bad[0]}{more}); nothing was "
                          f"saved. Check the options of {method} in grow.options (a scale such as noise, cross_std or "
                          f"init_std that is too large overflows)")


def finish(grown: torch.nn.Module, growth: Growth, out_dir, *, tokenizer_dir=None, provide=None) -> None:
    """The end of every grow job: the grown model's folder, then what `provide(out_dir)` writes there for
    the refiners (it returns the entries that name those files), then the record, last (it is the
    job's declared output: a job killed before it leaves no record, and Snakemake runs it again)."""
    save_grown(grown, out_dir, tokenizer_dir=tokenizer_dir)
    if provide is not None:
        growth.provided = provide(Path(out_dir))
    growth.write(out_dir)


def provide_moments(out_dir: Path, *, members, member_dirs, chain, n_embd, n_layer, seed, options) -> dict:
    """Need "moments": the members' final AdamW moments grown by the linear part of the same operator
    (growlm.growth.moments), from the step the furthest member reached."""
    loaded = [load_moments(Path(d) / MEMBER_MOMENTS_FILE) for d in member_dirs]
    moments = grow_moments(members, [m for m, _ in loaded], chain, n_embd=n_embd, n_layer=n_layer, seed=seed,
                           **options)
    step = max(s for _, s in loaded)
    save_grown_moments(out_dir / GROWN_MOMENTS_FILE, moments, step)
    log(f"carried the members' AdamW moments over (step {step:.0f}) for {len(moments)} parameters")
    return {"moments": GROWN_MOMENTS_FILE, "moments_step": step}


def provide_inherited(out_dir: Path, *, members, member_dirs, chain, n_embd, n_layer, seed, options) -> dict:
    """Need "inherited": bool masks of the grown weights' entries inherited from the members (the non-zero
    entries of the operator's linear part), stored as uint8."""
    masks = inherited_masks(members, chain if len(chain) > 1 else chain[0], n_embd=n_embd, n_layer=n_layer,
                            seed=seed, **options)
    save_file({k: v.to(torch.uint8).contiguous() for k, v in masks.items()}, str(out_dir / INHERITED_FILE))
    share = sum(int(v.sum()) for v in masks.values()) / max(1, sum(v.numel() for v in masks.values()))
    log(f"marked the inherited entries: {share:.1%} of the grown model's weights")
    return {"inherited": INHERITED_FILE}


# the grow job's provider of each need a refinement operator may declare (growlm.methods.GROW_NEEDS): it
# writes the need's file into the grown folder and returns the record's entries that name it (what the
# refiner's `settings` finds in `Growth.provided`)
PROVIDERS = {"moments": provide_moments, "inherited": provide_inherited}


def grow(*, member_dirs: list[str], method: str, n_embd: int, n_layer: int, seed: int, options: dict, out_dir,
         data_file=None, learned_batches: dict | None = None, plugins=None) -> None:
    """Combine the trained members into M'_1 with a growth operator; record its cost. What the chain's
    refinement operators need from this job (their `needs`: grown AdamW moments, the inherited entries'
    masks) is written beside the grown model by `PROVIDERS` and named in the record.
    `options` are the growth operators' (the refinement operators' options reach the refine job, not
    this one). `plugins`: the plugin files of the method's operators (the caller loaded them), recorded
    in growth.json for the refine job, which loads a plugin's refiners from them."""
    full_chain = method_chain(method)
    chain = growth_names(full_chain)
    options = operator_options(chain, options, seed=seed, data_file=data_file, learned_batches=learned_batches)
    used = member_dirs[:members_used(full_chain, len(member_dirs))]  # a single-source chain grows m_1 only
    members = [load_model(d) for d in used]  # (and the workflow waits only for those: growlm.experiment)
    t0 = time.perf_counter()
    with phase("grow"):
        grown = grow_models(members, chain if len(chain) > 1 else chain[0], n_embd=n_embd, n_layer=n_layer,
                            seed=seed, **options)
    wall = time.perf_counter() - t0
    check_finite(grown, method, options, data_file)
    flops = int(getattr(grown, "growlm_growth_flops", 0))
    member_cost = []
    trunks = {}
    for d in dict.fromkeys(str(d) for d in used):  # m_1 fed n times (control) costs once
        meta = read_json(Path(d) / "growlm.json")
        # wall_s: the member's training time, torch.compile's compilation left out (as in the ledgers' ratios)
        member_cost.append({"dir": str(d), "flops": meta["train"]["flops"],
                            "wall_s": meta["train"]["wall_s"] - meta["train"].get("compile_s", 0.0),
                            # a pretrained member's cost is priced by the comparison (members.cost)
                            **({"pretrained": True} if meta.get("role") == "pretrained member" else {})})
        if meta.get("init_from"):
            trunks[meta["init_from"]] = read_json(Path(meta["init_from"]) / "growlm.json")["train"]
    for d, t in trunks.items():  # the members' shared trunk (members.trunk) is paid for once
        member_cost.append({"dir": d, "flops": t["flops"], "wall_s": t["wall_s"] - t.get("compile_s", 0.0),
                            "role": "trunk"})

    def provide(out_dir: Path) -> dict:  # each need of the chain's refiners, by its provider
        provided = {}
        for need in chain_needs(full_chain):
            provided.update(PROVIDERS[need](out_dir, members=members, member_dirs=used, chain=chain, n_embd=n_embd,
                                            n_layer=n_layer, seed=seed, options=options))
        return provided

    shown = {k: v for k, v in options.items() if k != "batches"}
    finish(grown, Growth(method=method, chain=full_chain, options=shown, growth_flops=flops, growth_wall_s=wall,
                         members=member_cost, plugins=[str(p) for p in plugins or []]),
           out_dir, tokenizer_dir=tokenizer_of(data_file), provide=provide)
    log(f"grew {len(members)} member(s) with {method} into width {n_embd}, depth {n_layer} in {wall:.2f}s")


def grow_schedule(method: str, settings: dict, *, seed: int, train_file, val_file, tokenizer_dir, out_dir) -> None:
    """A schedule's grow job: what `growlm.schedules` registered for `method` runs with the settings its
    description gives (`growlm.experiment.schedule_settings`: its options under its own name) and
    returns the grown model and its cost, which end the job as every grow job ends (`finish`). No
    member is used, so none is counted."""
    if method not in RUNNERS:
        raise GrowlmError(f"{method!r} is not a schedule growlm can run (known: {', '.join(sorted(RUNNERS))})")
    grown, cost = RUNNERS[method](**settings, seed=seed, train_file=train_file, val_file=val_file,
                                  tokenizer_dir=tokenizer_dir, out_dir=Path(out_dir))
    finish(grown, Growth(method=method, chain=[method], options=settings[method], growth_flops=cost["flops"],
                         growth_wall_s=cost["wall_s"], stages=cost["stages"]), out_dir, tokenizer_dir=tokenizer_dir)
