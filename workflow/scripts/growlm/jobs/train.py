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

from growlm.devices import choose_device
from growlm.errors import GrowlmError, read_json
from growlm.growth import load_grown
from growlm.jobs.common import checkpoint_dir_for, log
from growlm.model import build_model, save_model
from growlm.optim_state import MEMBER_MOMENTS_FILE
from growlm.runner import run_torchrun, run_training
from growlm.tokenizer import vocab_size
from growlm.tokens import load_tokens, shard as take_shard
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
    if hasattr(model, "to_gpt2"):
        model = model.to_gpt2()
    save_model(model, out_dir, tokenizer_dir=tokenizer_dir, extra={**info, "train": summary})
    shutil.copy(ckpt / "ledger.csv", out_dir / "ledger.csv")
    shutil.copy(plan_path, out_dir / "plan.json")
    log(f"saved {out_dir}; final val loss {summary['final_val_loss']}")


def train_and_save(model, cfg: TrainConfig, *, train_file, val_file, out_dir, tokenizer_dir, info: dict,
                   shard: list[int] | None = None, memory_limit_gb: float | None = None) -> dict:
    """Train `model` in this process under its memory plan, then save it with its ledger and plan."""
    train_tokens = load_tokens(train_file)
    if shard is not None:
        train_tokens = take_shard(train_tokens, *shard)
    out_dir = Path(out_dir)
    ckpt = checkpoint_dir_for(out_dir)
    log(f"training {info.get('role')} ({sum(p.numel() for p in model.parameters())} parameters) for "
        f"{cfg.steps} steps of {cfg.batch_size}x{cfg.context} tokens on {cfg.device}; checkpoints in {ckpt}")
    summary, plan_path = run_training(model, cfg, train_tokens=train_tokens, val_tokens=load_tokens(val_file),
                                      ckpt_dir=ckpt, ledger_path=ckpt / "ledger.csv",
                                      memory_limit_gb=memory_limit_gb, log=log)
    _save(model, summary, plan_path, out_dir=out_dir, ckpt=ckpt, tokenizer_dir=tokenizer_dir, info=info)
    return summary


def train_model(*, train: dict, model: dict, init_seed: int, role: str, train_file, val_file, tokenizer_dir,
                out_dir, shard: list[int] | None = None, memory_limit_gb: float | None = None, gpus: int = 0,
                keep_moments: bool = False) -> dict:
    """A model from scratch: a small member (`keep_moments`: its final AdamW moments are saved for
    optimizer-state carry-over) or the baseline M_0. `train`: `growlm.experiment.train_settings`;
    `model`: `growlm.experiment.model_settings`."""
    spec = {**model, "vocab_size": vocab_size(tokenizer_dir)}
    cfg = TrainConfig.from_dict(train, device=choose_device())
    if keep_moments:
        cfg.save_moments = str(Path(out_dir) / MEMBER_MOMENTS_FILE)
    info = {"role": role, "init_seed": init_seed, "data_seed": cfg.seed}
    nproc = processes_for(gpus)
    if nproc > 1 and shard is None:
        out_dir = Path(out_dir)
        summary, plan_path = run_torchrun(nproc, model_spec={**spec, "seed": init_seed}, cfg=cfg, train_file=train_file,
                                          val_file=val_file, ckpt_dir=checkpoint_dir_for(out_dir), out_dir=out_dir,
                                          tokenizer_dir=tokenizer_dir, memory_limit_gb=memory_limit_gb, log=log)
        meta_path = out_dir / "growlm.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        meta_path.write_text(json.dumps({**meta, **info, "processes": nproc, "train": summary}, indent=2, default=str))
        shutil.copy(plan_path, out_dir / "plan.json")
        return summary
    return train_and_save(build_model(seed=init_seed, **spec), cfg, train_file=train_file, val_file=val_file,
                          out_dir=out_dir, tokenizer_dir=tokenizer_dir, shard=shard, memory_limit_gb=memory_limit_gb,
                          info={**info, "shard": shard})


def refine(*, train: dict, grown_dir, train_file, val_file, tokenizer_dir, out_dir, ramps: dict | None = None,
           memory_limit_gb: float | None = None) -> dict:
    """Train M'_1 into M_1 with the baseline's loop and budget (fresh AdamW with a short re-warm-up,
    or the members' carried-over moments when the grow job grew them). `ramps`: the mask-ramp lengths
    of a grown model with growth masks (`growlm.experiment.refine_ramps`), which must end within
    this refinement."""
    model = load_grown(grown_dir)
    growth = read_json(Path(grown_dir) / "growth.json")
    cfg = TrainConfig.from_dict(train, device=choose_device())
    if ramps and hasattr(model, "set_ramps"):
        too_long = {k: v for k, v in ramps.items() if v > cfg.steps}
        if too_long:
            raise GrowlmError(f"mask ramps {too_long} are longer than this refinement ({cfg.steps} steps): the "
                              "grown model could not become a plain GPT-2 by its end; shorten them in grow.options")
        model.set_ramps(**ramps)
        log(f"mask ramps: {ramps} (refinement steps)")
    if growth.get("optimizer_state") == "carry":
        cfg.init_moments = str(Path(grown_dir) / growth["moments"])
    return train_and_save(model, cfg, train_file=train_file, val_file=val_file, out_dir=out_dir,
                          tokenizer_dir=tokenizer_dir, memory_limit_gb=memory_limit_gb,
                          info={"role": "refined", "growth": growth, "ramps": ramps or {}, "data_seed": cfg.seed})
