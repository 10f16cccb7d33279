"""Jobs of the training stage: a member m_i, the baseline M_0, the refinement of M'_1 into M_1.

Each describes its `growlm.runner.TrainingJob` and runs it with `run_job` (the job's memory plan,
re-planned after an out-of-memory error; torchrun when the rule asks for several GPUs and they are
there), which saves the model as a `save_pretrained` folder with the shared tokenizer, its ledger,
its plan and `growlm.json` (the role, the seeds and train()'s summary, which the comparison reads for
the cost).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from growlm import hints, live
from growlm.console import log
from growlm.devices import choose_device
from growlm.envelope import windows_path
from growlm.errors import GrowlmError
from growlm.families import FAMILY, family_of
from growlm.growth import load_grown, load_plugins
from growlm.growth_record import Growth
from growlm.hub import hub_file, unreachable
from growlm.launch import run_options
from growlm.model import load_model, save_model
from growlm.optim_state import MEMBER_MOMENTS_FILE
from growlm.family_specs import spec_for_model_type
from growlm.pretrained import TOKENIZER_FILES, spec_of, tokenizer_identity
from growlm.pretrained import label as member_label
from growlm.refiners import REFINERS
from growlm.runner import TrainingJob, run_job
from growlm.shape import ModelShape
from growlm.tokenizer import vocab_size
from growlm.train_config import TrainConfig


def live_curves(settings: dict | None, *, grown_dir=None):
    """The training job's live curves (`train.log_to`, `growlm.live`), as its rule's `live` params give
    them; a refinement's start at the cost of its grown model's members and growth (`growth.json` in
    `grown_dir`), where the report's curves of M_1 start."""
    offset = 0.0
    if settings and settings.get("to") and grown_dir is not None:
        from growlm.compare import growth_cost  # here: keeps pandas out of the training jobs without live curves

        cost = growth_cost(Growth.read(grown_dir), settings.get("pretrained"))  # members.cost, if any
        offset = (0.0 if cost["unknown"] else cost["small_flops"]) + cost["growth_flops"]  # unknown members: free
    return live.session(settings, offset_flops=offset)


def train_model(*, train: dict, model: dict, init_seed: int, role: str, train_file, val_file, tokenizer_dir,
                out_dir, shard: list[int] | dict | None = None, memory_limit_gb: float | None = None, gpus: int = 0,
                nodes: int = 1, cpus_per_task: int = 0, gpu_share: float = 1.0, compile: bool | str = False,
                compile_ramps: bool = False, sync_every: int = 0, keep_moments: bool = False,
                init_from: str | None = None, branches: dict | None = None) -> dict:
    """A model from scratch: a small member (`keep_moments`: its final AdamW moments are saved for
    optimizer-state carry-over, and under wsd its model where the decay began, with the moments then,
    for growth before the decay: `growlm.runner.save_before_decay`) or the baseline M_0. `train`:
    `growlm.experiment.train_settings`; `model`: `growlm.experiment.model_settings`. How it runs (the rule's
    `how`): `gpus` (per node; torchrun with several, when they are visible; a GPU asked for but absent means
    the CPU), `nodes` (one torchrun agent on each node of the job's SLURM allocation, each task with
    `cpus_per_task`), `gpu_share` (of each
    GPU's memory, for the planner), `compile` (torch.compile the training steps: true or a mode),
    `compile_ramps` (a refinement's: also its masked form's ramp steps) and `sync_every` (steps between
    two reads of the losses on the host; 0: automatic). `branches`: {point: step} of a wsd run's cooldown
    branches (M_0's: growlm.branches.kept_steps), whose states the job keeps in its folder."""
    job = _model_job(train=train, model=model, init_seed=init_seed, role=role, train_file=train_file,
                     val_file=val_file, tokenizer_dir=tokenizer_dir, out_dir=out_dir, shard=shard,
                     memory_limit_gb=memory_limit_gb, gpu_share=gpu_share, compile=compile,
                     compile_ramps=compile_ramps, sync_every=sync_every, keep_moments=keep_moments)
    job.keep_at = branch_steps(job.cfg, branches)
    if init_from is not None:  # a branch of the members' shared trunk (members.trunk), in one process
        job.info["init_from"] = str(init_from)
        return run_job(job, model=branch_of(init_from, job.start["build"]))
    return run_job(job, **run_options(gpus, nodes, cpus_per_task))


def _model_job(*, train: dict, model: dict, init_seed: int, role: str, train_file, val_file, tokenizer_dir, out_dir,
               shard=None, memory_limit_gb: float | None = None, gpu_share: float = 1.0, compile: bool | str = False,
               compile_ramps: bool = False, sync_every: int = 0, keep_moments: bool = False) -> TrainingJob:
    """The `TrainingJob` of a model trained from scratch (`train_model`'s arguments): what the job and each
    of its cooldown branches (`cooldown`) train, built the same way."""
    spec = {**model, "vocab_size": vocab_size(tokenizer_dir)}
    cfg = TrainConfig.from_dict(train, device=choose_device(), compile=compile, compile_ramps=bool(compile_ramps),
                                sync_every=int(sync_every))
    if keep_moments:
        cfg.save_moments = str(Path(out_dir) / MEMBER_MOMENTS_FILE)
    info = {"role": role, "init_seed": init_seed, "data_seed": cfg.seed, "shard": shard}
    job = TrainingJob(cfg, out_dir=out_dir, train_file=train_file, val_file=val_file, tokenizer_dir=tokenizer_dir,
                      start={"build": {**spec, "seed": init_seed}}, info=info, shard=shard,
                      memory_limit_gb=memory_limit_gb, gpu_share=gpu_share, keep_before_decay=keep_moments)
    return job


DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "attention_dropout")


def import_member(member, *, out_dir, context: int = 128, number: int | None = None) -> dict:
    """A pretrained member (members.pretrained: a save_pretrained folder or a Hub id, growlm.pretrained)
    as a growlm model folder: loaded with `AutoModelForCausalLM.from_pretrained` (the same call for both,
    with its revision), its dropout set to zero (growlm trains every model without dropout), in
    float32 (a member stored in another dtype is converted, and the log says so), a model type that a
    family reads as its own (Qwen2, Mistral: the llama description's `read_as`) rebuilt as that family's
    model with the same weights and logits (`growlm.families.Family.adopt`), saved with its tokenizer and a
    growlm.json that says where it came from (the Hub commit its revision resolved to). What its training
    cost is not the import's to say: the comparison prices it from `members.cost` (`growlm.compare.priced`),
    so that a stated cost reruns the comparison alone. `number`: the member's place in members.pretrained
    (from 1), which every message names; by default the number of its folder (models/pretrained/m2: 2)."""
    spec = spec_of(member)
    where, revision = spec["where"], spec["revision"]
    out_dir = Path(out_dir)
    if number is None:
        digits = out_dir.name.removeprefix("m")
        number = int(digits) if digits.isdigit() else 1
    name = member_label(number, where)
    # a Hub member when the Hub cannot be used: from the cache at once (growlm.hub), not after retries
    cached = spec["kind"] == "hf" and unreachable() is not None
    if cached:
        hub_file(where, "config.json", revision=revision, what="Hub member")  # not in the cache: one whole line

    def whole(err: Exception) -> str:  # transformers' messages run over several lines: all of it, on one
        return f"{type(err).__name__}: {' '.join(str(err).split())}"

    try:
        model = AutoModelForCausalLM.from_pretrained(where, revision=revision, attn_implementation="sdpa",
                                                     local_files_only=cached)
    except Exception as err:  # a folder that is not a model, a wrong revision, a file missing from the cache
        raise GrowlmError(f"{name}: its model does not load ({whole(err)})") from None
    tokenizer_identity(spec, name)  # its tokenizer files, as the config check saw them (AutoTokenizer would make
    # an empty tokenizer of a Qwen2 model's class without them, and fails on others with a message over lines)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, revision=revision, local_files_only=cached)
    except Exception as err:  # no tokenizer files, or files no tokenizer class reads
        raise GrowlmError(f"{name}: its tokenizer does not load ({whole(err)}); growlm needs {TOKENIZER_FILES}") \
            from None
    stored = str(model.dtype).removeprefix("torch.")
    if stored != "float32":
        log(f"warning: {name}: its weights are {stored}; growlm trains in float32, so they are converted to float32")
    for key in DROPOUT_KEYS:
        if hasattr(model.config, key):
            setattr(model.config, key, 0.0)
    model.config.use_cache = False
    model = model.float()
    source_family, commit = model.config.model_type, getattr(model.config, "_commit_hash", None)
    reader = spec_for_model_type(source_family, read_as=True)
    if reader is not None and source_family in reader.read_as:  # Qwen2, Mistral: read as Llama
        model = FAMILY[reader.name].adopt(model, name, context=context)
    family_of(model)  # a family growlm grows, or a one-line error
    shape = ModelShape.of(model)
    info = {"role": "pretrained member", "source": spec, "commit": commit, "source_dtype": stored,
            "train": {"flops": None, "wall_s": 0.0, "tokens": None}}  # not trained here: priced by the comparison
    if source_family != shape.family:
        info["converted_from"] = source_family
    save_model(model, out_dir, extra=info)
    tokenizer.save_pretrained(out_dir)  # tokenizer.json (a slow tokenizer is converted) and its config
    if not (out_dir / "tokenizer.json").is_file():
        raise GrowlmError(f"{name}: its tokenizer has no fast (tokenizer.json) form")
    read_as = f" read as {shape.family}," if source_family != shape.family else ""
    log(f"imported {where} ({source_family},{read_as} width {shape.d}, depth {shape.L}, vocabulary {shape.V})")
    return info


def branch_of(trunk_dir, spec: dict) -> torch.nn.Module:
    """The members' shared trunk, as the start of one member's branch; it must have the member's shape."""
    model = load_model(trunk_dir)
    c = ModelShape.of(model)
    want = (spec["n_embd"], spec["n_layer"], spec["vocab_size"])
    if (c.d, c.L, c.V) != want:
        raise GrowlmError(f"the trunk {trunk_dir} has width {c.d}, depth {c.L}, vocabulary {c.V}, "
                          f"not the member's {want}; rebuild it and continue with "
                          f"`{hints.rebuild(Path(trunk_dir) / 'model.safetensors')}`")
    return model


def refiner_settings(refine_with: dict | None, growth: Growth, grown_dir, steps: int) -> dict:
    """`TrainConfig.refiners` for the refinement operators of the method (`growlm.experiment.
    refine_operators`: {name: options}): each refiner's own `settings` (growlm.refiners) - its options,
    its step counts held within the refinement's `steps`, and the files the grow job left for it."""
    return {name: REFINERS[name].settings(options, growth=growth, grown_dir=Path(grown_dir), steps=steps)
            for name, options in (refine_with or {}).items()}


def refine(*, train: dict, grown_dir, train_file, val_file, tokenizer_dir, out_dir, ramps: dict | None = None,
           memory_limit_gb: float | None = None, refine_with: dict | None = None, gpus: int = 0, nodes: int = 1,
           cpus_per_task: int = 0, gpu_share: float = 1.0, compile: bool | str = False, compile_ramps: bool = False,
           sync_every: int = 0, branches: dict | None = None) -> dict:
    """Train M'_1 into M_1 with the baseline's loop and budget (fresh AdamW with a short re-warm-up; the
    method's refinement operators, `refine_with`, on top: growlm.refiners). `ramps`: the mask-ramp lengths
    of a grown model with growth masks (`growlm.experiment.refine_ramps`), which must end within
    this refinement. `gpus`, `nodes`, `cpus_per_task`, `gpu_share`, `compile`, `compile_ramps`,
    `sync_every`: how it runs, as for `train_model`; with several processes the grown model is loaded by
    every process of the launch, on every node, ramps set the same way. `branches`: as for `train_model`."""
    model, job = refine_job(train=train, grown_dir=grown_dir, train_file=train_file, val_file=val_file,
                            tokenizer_dir=tokenizer_dir, out_dir=out_dir, ramps=ramps, memory_limit_gb=memory_limit_gb,
                            refine_with=refine_with, gpu_share=gpu_share, compile=compile, compile_ramps=compile_ramps,
                            sync_every=sync_every)
    job.keep_at = branch_steps(job.cfg, branches)
    return run_job(job, **run_options(gpus, nodes, cpus_per_task), model=model)


def refine_job(*, train: dict, grown_dir, train_file, val_file, tokenizer_dir, out_dir, ramps: dict | None = None,
               memory_limit_gb: float | None = None, refine_with: dict | None = None, gpu_share: float = 1.0,
               compile: bool | str = False, compile_ramps: bool = False, sync_every: int = 0):
    """The grown model, ramps set, and the `TrainingJob` of its refinement (`refine`'s arguments): what a
    refinement and each of its cooldown branches (`cooldown`) start from, built the same way."""
    model = load_grown(grown_dir)  # trained in place in one process; with several, each loads it
    growth = Growth.read(grown_dir)
    plugins = growth.plugins  # the plugin files of the method's operators (grow.plugins)
    load_plugins(plugins)  # a plugin's refinement operators register
    cfg = TrainConfig.from_dict(train, device=choose_device(), compile=compile, compile_ramps=bool(compile_ramps),
                                sync_every=int(sync_every))
    if ramps and hasattr(model, "set_ramps"):
        too_long = {k: v for k, v in ramps.items() if v > cfg.steps}
        if too_long:
            raise GrowlmError(f"mask ramps {too_long} are longer than this refinement ({cfg.steps} steps): the "
                              "grown model could not become a plain GPT-2 by its end; shorten them in grow.options")
        model.set_ramps(**ramps)
        log(f"mask ramps: {ramps} (refinement steps)")
    cfg.refiners = refiner_settings(refine_with, growth, grown_dir, cfg.steps) or None
    info = {"role": "refined", "growth": growth.to_dict(), "ramps": ramps or {}, "data_seed": cfg.seed,
            "refiners": cfg.refiners or {}}
    job = TrainingJob(cfg, out_dir=out_dir, train_file=train_file, val_file=val_file, tokenizer_dir=tokenizer_dir,
                      start={"grown": str(grown_dir), "ramps": ramps if hasattr(model, "set_ramps") else None},
                      info=info, memory_limit_gb=memory_limit_gb, gpu_share=gpu_share, plugins=plugins)
    return model, job


def branch_steps(cfg: TrainConfig, branches: dict | None) -> dict:
    """{point: step} of a wsd run's cooldown branches (`branches`: {point: step}, growlm.branches.kept_steps),
    each checked to lie in the run's stable phase; {} under the cosine."""
    if not cfg.decay_start:
        return {}
    out = {str(p): int(s) for p, s in (branches or {}).items()}
    wrong = {p: s for p, s in out.items() if not cfg.warmup_steps <= s <= cfg.decay_start}
    if wrong:
        raise GrowlmError(f"cooldown branch states {wrong} (point: step) lie outside this run's stable phase (steps "
                          f"{cfg.warmup_steps} to {cfg.decay_start})")
    return out


def cooldown(*, kind: str, branch: dict, state_dir, out_dir, gpus: int = 0, nodes: int = 1,
             cpus_per_task: int = 0, keep_model: bool = False, **start) -> dict:
    """A cooldown branch of a wsd run (M_0's, `kind` "baseline", or a refinement's, "refine"): the run planned
    for the branch's shorter budget, whose wsd decay begins at the branch's step, so that its last evaluation
    is the loss a run that ended there reaches (growlm.envelope). `branch`: what it runs (growlm.branches'
    `baseline_branch` or `refine_branch`: its step, its steps, and for a refinement its own settings, ramps and
    refiners resolved at its budget). `start`: the arguments of the full run's own job (`train_model`'s or
    `refine`'s, `out_dir` aside), from which its model and settings are built exactly as that job built them.
    Where the branch's settings are the full run's but the budget, it continues the full run's state kept at
    its step (`state_dir`); where they differ (`branch["from_start"]`: a refiner's share of a shorter budget),
    it trains from the start as its own run, and the state is not read. Writes the branch's ledger and
    `branch.json` (where it left, where it ended, its loss and FLOPs, the FLOPs it cost beyond the full run:
    the cooldown's, or the whole run's when it ran from the start) to `out_dir`; the model only with
    `keep_model`."""
    scratch = Path(out_dir) / "run"  # the TrainingJob's folder; only its ledger is kept
    if kind == "refine":
        _, full_job = refine_job(out_dir=scratch, **start)
        own = {k: branch[k] for k in ("train", "ramps", "refine_with")}
        model, job = refine_job(out_dir=scratch, **{**start, **own})
    else:
        model, job = None, _model_job(out_dir=scratch, **start)
    full, step, from_start = full_job.cfg if kind == "refine" else job.cfg, int(branch["step"]), bool(branch["from_start"])
    planned = full.branch(step, int(branch["steps"]))
    if kind == "refine":
        same = job.cfg.run_settings() == {**planned.run_settings(), "refiners": job.cfg.refiners}
        if not from_start and not (same and job.cfg.refiners == full.refiners):
            raise GrowlmError(f"the cooldown branch at step {step} was planned to continue the refinement's state, "
                              "but its settings differ from the refinement's; plan the workflow again")
    else:
        job.cfg = planned
    if not from_start:
        job.start_from, job.start_cfg = str(state_dir), full.to_dict()
    job.save = bool(keep_model)
    fraction = float(branch["fraction"])
    job.info.update(role=f"{job.info.get('role')} cooldown branch",
                    branch={"fraction": fraction, "step": step, "from_start": from_start})
    how = f"from step 0 as its own run ({'; '.join(branch.get('differs') or [])} differ)" if from_start else \
        "from the state kept there"
    log(f"cooldown branch at {fraction:g} of the stable phase: step {step} of {full.steps}, decaying to step "
        f"{job.cfg.steps} ({job.cfg.wsd_decay:.0%} of {job.cfg.steps} steps, {job.cfg.wsd_shape}), {how}")
    summary = run_job(job, **run_options(gpus, nodes, cpus_per_task), model=model)
    per_step = job.cfg.batch_size * job.cfg.context
    record = {"kind": kind, "fraction": fraction, "step": step, "of": full.steps, "steps": job.cfg.steps,
              "tokens": job.cfg.steps * per_step, "budget": branch.get("budget"), "at_budget": branch.get("at_budget"),
              "from_start": from_start, "flops": summary["flops"], "final_val_loss": summary["final_val_loss"],
              "cooldown_flops": summary["flops"] - (0.0 if from_start else summary["decay_start_flops"]),
              "wall_s": summary["wall_s"], "schedule": job.cfg.schedule_text()}
    if from_start:
        record["differs"] = list(branch.get("differs") or [])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(scratch / "ledger.csv", out / "ledger.csv")
    if windows_path(scratch / "ledger.csv").is_file():  # the last evaluation's window losses, beside the ledger
        shutil.copy(windows_path(scratch / "ledger.csv"), windows_path(out / "ledger.csv"))
    if keep_model:
        for f in scratch.iterdir():
            if f.is_file() and f.name not in ("ledger.csv", windows_path("ledger.csv").name):
                shutil.copy(f, out / f.name)
    (out / "branch.json").write_text(json.dumps(record, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)
    return record

