"""Jobs of the training stage: a member m_i, the baseline M_0, the refinement of M'_1 into M_1.

Each trains with `growlm.runner` (the job's memory plan, re-planned after an out-of-memory error;
torchrun when the rule asks for several GPUs and they are there), then saves the model as a
`save_pretrained` folder with the shared tokenizer, its ledger, its plan and `growlm.json` (the role,
the seeds and train()'s summary, which the comparison reads for the cost).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from growlm import checkpoint, hints
from growlm.devices import choose_device
from growlm.errors import GrowlmError, digest, read_json
from growlm.families import family_of
from growlm.growth import load_grown
from growlm.jobs.common import checkpoint_dir_for, log, warn
from growlm.model import build_model, load_model, save_model
from growlm.optim_state import MEMBER_MOMENTS_FILE
from growlm.pretrained import member_cost_flops, spec_of
from growlm.runner import run_torchrun, run_training
from growlm.shape import ModelShape
from growlm.tokenizer import vocab_size
from growlm.tokens import book_clusters, cluster as take_cluster, load_tokens, shard as take_shard, token_sources
from growlm.train_config import TrainConfig


def processes_for(gpus: int) -> int:
    """Processes to launch: the GPUs a training job asks for (its `gpu` resource) when that many are
    visible; GROWLM_NPROC overrides (e.g. 2 gloo processes on a CPU, for tests)."""
    if os.environ.get("GROWLM_NPROC"):
        return int(os.environ["GROWLM_NPROC"])
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus > 1 and have < gpus:
        log(f"{gpus} GPUs asked for but {have} visible: training in one process")
    return gpus if gpus > 1 and have >= gpus else 1


def _save(model, summary: dict, plan_path: Path, *, out_dir: Path, ckpt: Path, tokenizer_dir, info: dict) -> None:
    if hasattr(model, "to_plain"):  # a grown model with growth masks: a plain model by now
        model = model.to_plain()
    save_model(model, out_dir, tokenizer_dir=tokenizer_dir, extra={**info, "train": summary})
    shutil.copy(ckpt / "ledger.csv", out_dir / "ledger.csv")
    shutil.copy(plan_path, out_dir / "plan.json")
    checkpoint.remove_finished(ckpt)
    log(f"saved {out_dir}; final val loss {summary['final_val_loss']}")


def identify_inputs(cfg: TrainConfig, *, train_file, val_file, tokenizer_dir, shard=None) -> None:
    """Set `cfg.inputs`: the sha256 of every file the run reads and the part of the data it takes,
    so that its checkpoints resume only a run with the same data (`growlm.checkpoint.run_identity`):
    after the corpus, the tokenizer, the levels or `members.data` changed, a rerun starts over."""
    inputs = {"training tokens": digest(train_file), "validation tokens": digest(val_file),
              "tokenizer": digest(Path(tokenizer_dir) / "tokenizer.json"),
              "part of the training tokens": json.dumps(shard, sort_keys=True)}
    refiners = cfg.refiners or {}
    if "carry" in refiners:
        inputs["carried moments"] = digest(refiners["carry"]["moments"])
    for i, teacher in enumerate((refiners.get("teach") or {}).get("teachers", [])):
        inputs[f"teacher {i + 1}"] = digest(Path(teacher) / "model.safetensors")
    if "freeze" in refiners:
        inputs["frozen entries"] = digest(refiners["freeze"]["masks"])
    cfg.inputs = inputs


def _members_part(train_tokens, shard, context: int, budget: int):
    """The member's part of the members' text: checked against one training window, named by the
    setting that made it (a warning in the terminal when the budget reads it very often)."""
    what = ("cluster of books" if isinstance(shard, dict) else "shard") if shard is not None else None
    if what is None:
        return
    count = shard["count"] if isinstance(shard, dict) else shard[1]
    if train_tokens.size < context + 1:
        raise GrowlmError(f"members.shards = {count}: this member's {what} holds {train_tokens.size} tokens, fewer "
                          f"than one training window of {context + 1} (model.context + 1); use fewer shards")
    epochs = budget / train_tokens.size
    if epochs > 20:
        warn(f"members.shards = {count}: this member's {what} holds {train_tokens.size} tokens, so its budget of "
             f"{budget} tokens reads it {epochs:.0f} times")


def train_and_save(model, cfg: TrainConfig, *, train_file, val_file, out_dir, tokenizer_dir, info: dict,
                   shard: list[int] | dict | None = None, memory_limit_gb: float | None = None,
                   gpu_share: float = 1.0) -> dict:
    """Train `model` in this process under its memory plan, then save it with its ledger and plan."""
    train_tokens = load_tokens(train_file)
    if isinstance(shard, dict):  # members.data: clusters - the member's cluster of books
        train_tokens = take_cluster(train_tokens, token_sources(train_file), shard["index"], shard["count"])
        log(f"cluster {shard['index'] + 1} of {shard['count']}: "
            f"{', '.join(book_clusters(token_sources(train_file), shard['count'])[shard['index']])}")
    elif shard is not None:
        train_tokens = take_shard(train_tokens, *shard)
    _members_part(train_tokens, shard, cfg.context, cfg.tokens)
    identify_inputs(cfg, train_file=train_file, val_file=val_file, tokenizer_dir=tokenizer_dir, shard=shard)
    out_dir = Path(out_dir)
    ckpt = checkpoint_dir_for(out_dir)
    log(f"training {info.get('role')} ({sum(p.numel() for p in model.parameters())} parameters) for "
        f"{cfg.steps} steps of {cfg.batch_size}x{cfg.context} tokens on {cfg.device}; checkpoints in {ckpt}")
    summary, plan_path = run_training(model, cfg, train_tokens=train_tokens, val_tokens=load_tokens(val_file),
                                      ckpt_dir=ckpt, ledger_path=ckpt / "ledger.csv",
                                      memory_limit_gb=memory_limit_gb, gpu_share=gpu_share, log=log)
    _save(model, summary, plan_path, out_dir=out_dir, ckpt=ckpt, tokenizer_dir=tokenizer_dir, info=info)
    return summary


def train_under_torchrun(nproc: int, *, cfg: TrainConfig, out_dir, info: dict, **launch) -> dict:
    """Train with `nproc` processes (`growlm.runner.run_torchrun`, which takes `launch`: the model
    to build or the grown model to load, the data, the memory settings); rank 0 saves the model,
    then this job adds its own record to the model's growlm.json and copies the plan beside it, as
    a one-process job does."""
    out_dir = Path(out_dir)
    identify_inputs(cfg, train_file=launch["train_file"], val_file=launch["val_file"],
                    tokenizer_dir=launch["tokenizer_dir"])
    log(f"training {info.get('role')} for {cfg.steps} steps of {cfg.batch_size}x{cfg.context} tokens in {nproc} "
        f"processes; checkpoints in {checkpoint_dir_for(out_dir)}")
    summary, plan_path = run_torchrun(nproc, cfg=cfg, ckpt_dir=checkpoint_dir_for(out_dir), out_dir=out_dir, log=log,
                                      **launch)
    meta_path = out_dir / "growlm.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    meta_path.write_text(json.dumps({**meta, **info, "processes": nproc, "train": summary}, indent=2, default=str))
    shutil.copy(plan_path, out_dir / "plan.json")
    checkpoint.remove_finished(checkpoint_dir_for(out_dir))
    log(f"saved {out_dir}; final val loss {summary.get('final_val_loss')}")
    return summary


def train_model(*, train: dict, model: dict, init_seed: int, role: str, train_file, val_file, tokenizer_dir,
                out_dir, shard: list[int] | dict | None = None, memory_limit_gb: float | None = None, gpus: int = 0,
                gpu_share: float = 1.0, compile: bool | str = False, sync_every: int = 0, keep_moments: bool = False,
                init_from: str | None = None) -> dict:
    """A model from scratch: a small member (`keep_moments`: its final AdamW moments are saved for
    optimizer-state carry-over) or the baseline M_0. `train`: `growlm.experiment.train_settings`;
    `model`: `growlm.experiment.model_settings`. How it runs (the rule's `how`): `gpus` (torchrun with
    several, when they are visible; a GPU asked for but absent means the CPU), `gpu_share` (of each
    GPU's memory, for the planner), `compile` (torch.compile the training steps: true or a mode) and
    `sync_every` (steps between two reads of the losses on the host; 0: automatic)."""
    spec = {**model, "vocab_size": vocab_size(tokenizer_dir)}
    cfg = TrainConfig.from_dict(train, device=choose_device(), compile=compile, sync_every=int(sync_every))
    if keep_moments:
        cfg.save_moments = str(Path(out_dir) / MEMBER_MOMENTS_FILE)
    info = {"role": role, "init_seed": init_seed, "data_seed": cfg.seed}
    if init_from is not None:  # a branch of the members' shared trunk (members.trunk)
        return train_and_save(branch_of(init_from, spec), cfg, train_file=train_file, val_file=val_file,
                              out_dir=out_dir, tokenizer_dir=tokenizer_dir, shard=shard,
                              memory_limit_gb=memory_limit_gb, gpu_share=gpu_share,
                              info={**info, "shard": shard, "init_from": str(init_from)})
    nproc = processes_for(gpus)
    if nproc > 1 and shard is None:
        return train_under_torchrun(nproc, cfg=cfg, out_dir=out_dir, info=info, model_spec={**spec, "seed": init_seed},
                                    train_file=train_file, val_file=val_file, tokenizer_dir=tokenizer_dir,
                                    memory_limit_gb=memory_limit_gb, gpu_share=gpu_share)
    return train_and_save(build_model(seed=init_seed, **spec), cfg, train_file=train_file, val_file=val_file,
                          out_dir=out_dir, tokenizer_dir=tokenizer_dir, shard=shard, memory_limit_gb=memory_limit_gb,
                          gpu_share=gpu_share, info={**info, "shard": shard})


DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "attention_dropout")


def import_member(member, *, out_dir, cost: dict | None = None, context: int = 128) -> dict:
    """A pretrained member (members.pretrained: a save_pretrained folder or a Hub id, growlm.pretrained)
    as a growlm model folder: loaded with `AutoModelForCausalLM.from_pretrained` (the same call for both,
    with its revision), its dropout set to zero (growlm trains every model without dropout), in
    float32, saved with its tokenizer and a growlm.json that says where it came from (the Hub commit
    its revision resolved to) and what its training cost: the stated `members.cost`, or unknown."""
    spec = spec_of(member)
    where, revision = spec["where"], spec["revision"]
    try:
        model = AutoModelForCausalLM.from_pretrained(where, revision=revision, attn_implementation="sdpa")
        tokenizer = AutoTokenizer.from_pretrained(where, revision=revision)
    except Exception as err:  # a folder that is not a model, no network for a Hub id, a wrong revision
        raise GrowlmError(f"members.pretrained: {where!r} does not load: {type(err).__name__}: "
                          f"{str(err).splitlines()[0][:200]}") from None
    family_of(model)  # a family growlm grows, or a one-line error
    for key in DROPOUT_KEYS:
        if hasattr(model.config, key):
            setattr(model.config, key, 0.0)
    model.config.use_cache = False
    model = model.float()
    shape = ModelShape.of(model)
    flops = member_cost_flops(cost, shape, context)
    info = {"role": "pretrained member", "source": spec, "commit": getattr(model.config, "_commit_hash", None),
            "cost": "stated" if flops is not None else "unknown",
            "train": {"flops": flops, "wall_s": 0.0, "tokens": (cost or {}).get("tokens")}}
    out_dir = Path(out_dir)
    save_model(model, out_dir, extra=info)
    tokenizer.save_pretrained(out_dir)  # tokenizer.json (a slow tokenizer is converted) and its config
    if not (out_dir / "tokenizer.json").is_file():
        raise GrowlmError(f"members.pretrained: {where!r}: its tokenizer has no fast (tokenizer.json) form")
    log(f"imported {where} ({shape.family}, width {shape.d}, depth {shape.L}, vocabulary {shape.V}); training cost "
        f"{'%.3g FLOPs (stated)' % flops if flops is not None else 'unknown (not counted)'}")
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


def refiner_settings(refine_with: dict | None, growth: dict, grown_dir, steps: int) -> dict:
    """`TrainConfig.refiners` for the refinement operators of the method (`growlm.experiment.
    refine_operators`: {name: options}): each one's options, with what the grow job left for it -
    `teach`: the members it used (growth.json) as teachers; `freeze`: the entries it marked as inherited
    (`inherited.safetensors`); `carry`: the members' grown moments - and its step counts within the
    refinement's `steps`."""
    out = {}
    for name, options in (refine_with or {}).items():
        kw = dict(options)
        if name == "teach":
            teachers = list(dict.fromkeys(m["dir"] for m in growth["members"] if m.get("role") != "trunk"))
            if not teachers:
                raise GrowlmError(f"teach: {grown_dir}/growth.json names no members to teach")
            kw.update(teachers=teachers, teach_steps=min(int(kw["teach_steps"]), steps))
            log(f"teach: {len(teachers)} member(s) teach for {kw['teach_steps']} steps (weight {kw['teach_weight']} "
                f"-> 0, temperature {kw['temperature']})")
        elif name == "freeze":
            masks = Path(grown_dir) / growth.get("inherited", "inherited.safetensors")
            if not masks.is_file():
                raise GrowlmError(f"freeze: {masks} is missing (the grow job writes it for methods with freeze); "
                                  f"rebuild it and continue with `{hints.rebuild(masks)}`")
            kw.update(masks=str(masks), freeze_steps=min(int(kw["freeze_steps"]), steps))
            log(f"freeze: inherited weights held for {kw['freeze_steps']} steps")
        elif name == "carry":
            if not growth.get("moments"):
                raise GrowlmError(f"carry: {grown_dir}/growth.json names no grown moments; rebuild it and continue "
                                  f"with `{hints.rebuild(Path(grown_dir) / 'growth.json')}`")
            kw.update(moments=str(Path(grown_dir) / growth["moments"]))
        out[name] = kw
    return out


def refine(*, train: dict, grown_dir, train_file, val_file, tokenizer_dir, out_dir, ramps: dict | None = None,
           memory_limit_gb: float | None = None, refine_with: dict | None = None, gpus: int = 0,
           gpu_share: float = 1.0, compile: bool | str = False, sync_every: int = 0) -> dict:
    """Train M'_1 into M_1 with the baseline's loop and budget (fresh AdamW with a short re-warm-up; the
    method's refinement operators, `refine_with`, on top: growlm.refiners). `ramps`: the mask-ramp lengths
    of a grown model with growth masks (`growlm.experiment.refine_ramps`), which must end within
    this refinement. `gpus`, `gpu_share`, `compile`, `sync_every`: how it runs, as for `train_model`; with several
    GPUs the grown model is loaded by every process of a torchrun launch, ramps set the same way."""
    model = load_grown(grown_dir)
    growth = read_json(Path(grown_dir) / "growth.json")
    cfg = TrainConfig.from_dict(train, device=choose_device(), compile=compile, sync_every=int(sync_every))
    if ramps and hasattr(model, "set_ramps"):
        too_long = {k: v for k, v in ramps.items() if v > cfg.steps}
        if too_long:
            raise GrowlmError(f"mask ramps {too_long} are longer than this refinement ({cfg.steps} steps): the "
                              "grown model could not become a plain GPT-2 by its end; shorten them in grow.options")
        model.set_ramps(**ramps)
        log(f"mask ramps: {ramps} (refinement steps)")
    cfg.refiners = refiner_settings(refine_with, growth, grown_dir, cfg.steps) or None
    info = {"role": "refined", "growth": growth, "ramps": ramps or {}, "data_seed": cfg.seed,
            "refiners": cfg.refiners or {}}
    nproc = processes_for(gpus)
    if nproc > 1:
        return train_under_torchrun(nproc, cfg=cfg, out_dir=out_dir, info=info, grown_dir=grown_dir,
                                    ramps=ramps if hasattr(model, "set_ramps") else None, shape=ModelShape.of(model),
                                    train_file=train_file, val_file=val_file, tokenizer_dir=tokenizer_dir,
                                    memory_limit_gb=memory_limit_gb, gpu_share=gpu_share)
    return train_and_save(model, cfg, train_file=train_file, val_file=val_file, out_dir=out_dir,
                          tokenizer_dir=tokenizer_dir, memory_limit_gb=memory_limit_gb, gpu_share=gpu_share,
                          info=info)
