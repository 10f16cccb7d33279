"""Running one training job: its memory plan, re-planning after an out-of-memory error, torchrun.

`run_training(model, cfg, ...)` is what every training job of the workflow calls in one process: it
takes the job's memory plan (`job_plan`: the one a previous attempt left beside the checkpoints, if
it was made for these very settings, else a new one from `growlm.memory.measure.make_plan`), then
trains under it (`train_with_replanning`): on a CUDA out-of-memory error it steps one rung down the
plan's ladder, writes the smaller plan and resumes from the last checkpoint.

`run_torchrun(nproc, ...)` does the same with several processes: it writes the plan, the model (or
the folder of a grown model and its mask ramps) and training settings as JSON and launches
`python -m growlm.torchrun` under `torch.distributed.run`.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from growlm.distributed import wrap_model
from growlm.errors import GrowlmError, stop_with_parent
from growlm.memory.estimate import Plan, apply_plan, next_smaller, read_plan, write_plan
from growlm.memory.measure import make_plan
from growlm.shape import ModelShape
from growlm.train import train
from growlm.train_config import TrainConfig

PLAN_FILE = "plan.json"  # beside the checkpoints, and copied beside the saved model


def plan_settings(shape: ModelShape, cfg: TrainConfig, *, n_devices: int, memory_limit_gb: float | None,
                  gpu_share: float = 1.0) -> dict:
    """What a memory plan depends on: a plan is reused only when all of these are the same."""
    return {"model": shape.as_dict(), "global_batch": cfg.batch_size, "context": cfg.context,
            "n_devices": n_devices, "device_type": torch.device(cfg.device).type,
            "memory_limit_gb": memory_limit_gb, "gpu_share": gpu_share}


def limit_gpu_memory(device: str, gpu_share: float = 1.0) -> None:
    """Hold this process's CUDA allocator to its share of the GPU (`gpu_share` < 1: several jobs
    share it), so that a job that outgrows its plan gets an out-of-memory error of its own, and is
    re-planned, instead of taking memory its neighbours planned for. Nothing on the CPU."""
    if gpu_share < 1 and torch.device(device).type == "cuda":
        torch.cuda.set_per_process_memory_fraction(gpu_share, torch.device(device))


def job_plan(shape: ModelShape, cfg: TrainConfig, ckpt_dir: str | Path, *, n_devices: int = 1,
             memory_limit_gb: float | None = None, gpu_share: float = 1.0, log=print) -> tuple[Plan, Path]:
    """The memory plan of a training job and its path (in `ckpt_dir`): the plan a previous attempt
    left there (it may have been stepped down after an out-of-memory error) when it was made for the
    same settings (`plan_settings`), else a new one, written there."""
    path = Path(ckpt_dir) / PLAN_FILE
    wanted = plan_settings(shape, cfg, n_devices=n_devices, memory_limit_gb=memory_limit_gb, gpu_share=gpu_share)
    if path.is_file():
        try:
            plan = read_plan(path)
        except GrowlmError as err:
            log(f"ignoring the memory plan left in {path} ({err}); making a new one")
        else:
            if plan.made_for == wanted:
                log(f"memory plan from the previous attempt: {plan.describe()}")
                return plan, path
            log(f"the memory plan left in {path} was made for other settings; making a new one")
    plan = make_plan(shape, context=cfg.context, global_batch=cfg.batch_size, n_devices=n_devices,
                     memory_limit_gb=memory_limit_gb, device=cfg.device, gpu_share=gpu_share, log=log)
    plan.made_for = wanted
    write_plan(plan, path)
    return plan, path


def _free(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def train_with_replanning(build_model: Callable[[], torch.nn.Module], train_tokens, val_tokens, cfg: TrainConfig,
                          plan: Plan, *, ckpt_dir, ledger_path, plan_path=None, log=print, step_callback=None,
                          allow_offload: bool = True) -> dict:
    """`growlm.train.train` under `plan`; on a CUDA out-of-memory error, step down to `next_smaller(plan)`,
    write it to `plan_path` (if given), log it and resume from the last checkpoint in `ckpt_dir` (or
    from the start if there is none yet). Raises GrowlmError when the smallest plan runs out of memory.

    `build_model()` returns a fresh, unwrapped model with the initial weights; it is wrapped for the
    plan's strategy (`growlm.distributed.wrap_model`) on every attempt, so that a switch to FSDP2 with
    offload works. Returns train()'s summary with the final plan under "plan".

    Within one process only: under torchrun, `growlm.torchrun` writes the smaller plan and exits
    non-zero, so that the retried job (Snakemake `retries`) resumes with it."""
    while True:
        model = wrap_model(build_model(), plan, device=cfg.device)
        try:
            summary = train(model, train_tokens, val_tokens, apply_plan(cfg, plan), ckpt_dir=ckpt_dir,
                            ledger_path=ledger_path, log=log, step_callback=step_callback)
            summary["plan"] = asdict(plan)
            return summary
        except torch.cuda.OutOfMemoryError as err:
            message = str(err).splitlines()[0] if str(err) else "CUDA out of memory"
        del model
        _free(cfg.device)  # the failed attempt's tensors went with its frames
        smaller = next_smaller(plan, allow_offload=allow_offload)
        if smaller is None:
            raise GrowlmError(f"out of memory with the smallest setting the planner has ({plan.describe()}): "
                              f"{message}. Use more or larger devices, or a smaller model or context")
        log(f"CUDA out of memory with {plan.describe()} ({message}); re-planned: {smaller.describe()}; "
            f"resuming from the last checkpoint in {ckpt_dir}")
        plan = smaller
        if plan_path is not None:
            write_plan(plan, plan_path)


def run_training(model: torch.nn.Module, cfg: TrainConfig, *, train_tokens: np.ndarray, val_tokens: np.ndarray,
                 ckpt_dir: str | Path, ledger_path: str | Path, memory_limit_gb: float | None = None,
                 gpu_share: float = 1.0, log=print) -> tuple[dict, Path]:
    """Train `model` in place under its job's memory plan (re-planned after an out-of-memory error);
    returns train()'s summary and the path of the plan it finished with. `gpu_share`: the share of
    the GPU's memory this job was given (`limit_gpu_memory`)."""
    limit_gpu_memory(cfg.device, gpu_share)
    plan, plan_path = job_plan(ModelShape.of(model), cfg, ckpt_dir, memory_limit_gb=memory_limit_gb,
                               gpu_share=gpu_share, log=log)
    initial = copy.deepcopy(model.state_dict())  # a re-planned attempt starts from these weights

    def fresh_model():
        model.load_state_dict(initial)
        return model

    summary = train_with_replanning(fresh_model, train_tokens, val_tokens, cfg, plan, ckpt_dir=ckpt_dir,
                                    ledger_path=ledger_path, plan_path=plan_path, log=log)
    return summary, plan_path


# ----------------------------------------------------------------------------------------------
# several processes
# ----------------------------------------------------------------------------------------------

def launch_command(nproc: int, module_args: list, *, python: str | None = None) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc_per_node=N -m growlm.torchrun ARGS`
    (the `torchrun` console script, invoked through the interpreter so that the environment's is used)."""
    if nproc < 1:
        raise GrowlmError(f"nproc must be at least 1, got {nproc}")
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "growlm.torchrun", *[str(a) for a in module_args]]


def _package_env() -> dict:
    """The environment of a child process that must import this very growlm (installed or not)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def run_torchrun(nproc: int, *, cfg: TrainConfig, train_file, val_file, ckpt_dir, out_dir,
                 model_spec: dict | None = None, grown_dir=None, ramps: dict | None = None,
                 shape: ModelShape | None = None, tokenizer_dir=None, memory_limit_gb: float | None = None,
                 gpu_share: float = 1.0, log=print) -> tuple[dict, Path]:
    """Train with `nproc` processes under torchrun (DDP or FSDP2, as the plan says); rank 0 saves the
    model into `out_dir`. The model is one of: `model_spec`, keyword arguments of
    `growlm.model.build_model` with `seed` (a model from scratch); `grown_dir`, a grown model as
    `growlm.growth.save_grown` wrote it, with its mask-ramp lengths `ramps` (a refinement; `shape`,
    the grown model's shape, for the plan). Each process builds or loads the same model. Returns the
    summary and the path of the plan."""
    if (model_spec is None) == (grown_dir is None):
        raise GrowlmError("run_torchrun needs exactly one of model_spec (a new model) and grown_dir (a grown one)")
    ckpt = Path(ckpt_dir)
    ckpt.mkdir(parents=True, exist_ok=True)
    if shape is None:
        if model_spec is None:
            raise GrowlmError("run_torchrun with grown_dir needs the grown model's shape for its memory plan")
        shape = ModelShape.of({k: v for k, v in model_spec.items() if k != "seed"})
    _, plan_path = job_plan(shape, cfg, ckpt, n_devices=nproc, memory_limit_gb=memory_limit_gb, gpu_share=gpu_share,
                            log=log)
    (ckpt / "train.json").write_text(cfg.with_(device="cpu").to_json())  # each rank picks its device
    if model_spec is not None:
        (ckpt / "model.json").write_text(json.dumps(model_spec))
        args = ["--model-config", ckpt / "model.json"]
    else:
        (ckpt / "ramps.json").write_text(json.dumps(ramps or {}))
        args = ["--grown-model", grown_dir, "--ramps", ckpt / "ramps.json"]
    args += ["--train-file", train_file, "--val-file", val_file,
             "--train-config", ckpt / "train.json", "--plan", plan_path, "--ckpt-dir", ckpt,
             "--ledger", ckpt / "ledger.csv", "--out-dir", out_dir, "--summary", ckpt / "summary.json",
             "--gpu-share", gpu_share]
    if tokenizer_dir:
        args += ["--tokenizer-dir", tokenizer_dir]
    cmd = launch_command(nproc, args)
    log(f"launching {nproc} processes: {' '.join(cmd)}")
    proc = subprocess.run(cmd, env=_package_env(), preexec_fn=stop_with_parent)  # stops with this job
    if proc.returncode != 0:
        raise GrowlmError(f"torchrun with {nproc} processes failed (exit {proc.returncode}); the job resumes from "
                          f"{ckpt} when rerun")
    return json.loads((ckpt / "summary.json").read_text()), plan_path
