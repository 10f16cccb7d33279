"""Running one training job, in one process or several: one path, launched two ways.

A `TrainingJob` says what to train (a new model, a grown one, or a model already in memory), on which
data (the member's shard or cluster of books), with which settings, and where the model goes.
`run_job(job, nproc)` is what every training job of the workflow calls:

1. it takes the job's memory plan (`job_plan`: the one a previous attempt left beside the
   checkpoints, if it was made for these very settings, else a new one from
   `growlm.memory.measure.make_plan`) and logs what it will train;
2. it runs `execute(job)`: in this process, or - with several processes - in every process of
   `python -m torch.distributed.run ... -m growlm.torchrun JOB.json`, which calls the same function.
   `execute` builds or loads the model, takes the job's tokens, trains under the plan
   (`train_with_replanning`: on a CUDA out-of-memory error it steps one rung down the plan's ladder,
   writes the smaller plan and resumes from the last checkpoint - in one process at once, under
   torchrun by exiting so that the retried job resumes) and saves the model (rank 0 writes);
3. it copies the plan beside the model, keeps a member's model from where its wsd decay began
   (`save_before_decay`), removes the finished run's checkpoints and logs the result.

So torchrun is how a job is launched, not a second copy of it: the model, the data, the ledger, the
saved files and the log lines are the same either way.
"""

from __future__ import annotations

import copy
import csv
import gc
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

import torch

from growlm import checkpoint
from growlm.console import log as job_log, warn
from growlm.distributed import init_process_group, ranks_where, save_full_model, wrap_model
from growlm.envelope import windows_path
from growlm.errors import GrowlmError, digest, read_json
from growlm.launch import job_allocation, run_across_nodes, run_here, standalone_command
from growlm.growth import load_grown, load_plugins
from growlm.memory.estimate import Plan, apply_plan, next_smaller, read_plan, write_plan
from growlm.memory.measure import make_plan
from growlm.model import build_model, load_model, save_model
from growlm.optim_state import save_moments
from growlm.refiners import REFINERS
from growlm.shape import ModelShape
from growlm.tokens import book_clusters, cluster as take_cluster, load_tokens, shard as take_shard, token_sources
from growlm.train import LEDGER_COLUMNS, make_optimizer, train
from growlm.train_config import BEFORE_DECAY, TrainConfig

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
                          allow_offload: bool = True, world: int = 1, rank: int = 0, **branching) -> dict:
    """`growlm.train.train` under `plan`; on a CUDA out-of-memory error, step down to `next_smaller(plan)`,
    write it to `plan_path` (if given), log it and resume from the last checkpoint in `ckpt_dir` (or
    from the start if there is none yet). Raises GrowlmError when the smallest plan runs out of memory.

    `build_model()` returns a fresh, unwrapped model with the initial weights; it is wrapped for the
    plan's strategy (`growlm.distributed.wrap_model`) on every attempt, so that a switch to FSDP2 with
    offload works. Returns train()'s summary with the final plan under "plan".

    With several processes (`world` > 1) the others wait in collectives, so a process that runs out
    of memory writes the smaller plan to `plan_path` and exits with status 1 instead: torchrun stops
    the others, and the retried job (Snakemake `retries`) resumes with the smaller plan. `branching`:
    train()'s `keep_at`, `start_from` and `start_cfg` (cooldown branches, growlm.envelope)."""
    while True:
        model = wrap_model(build_model(), plan, device=cfg.device)
        try:
            summary = train(model, train_tokens, val_tokens, apply_plan(cfg, plan), ckpt_dir=ckpt_dir,
                            ledger_path=ledger_path, log=log, step_callback=step_callback, **branching)
            summary["plan"] = asdict(plan)
            return summary
        except torch.cuda.OutOfMemoryError as err:
            message = str(err).splitlines()[0] if str(err) else "CUDA out of memory"
        del model
        _free(cfg.device)  # the failed attempt's tensors went with its frames
        smaller = next_smaller(plan, allow_offload=allow_offload)
        if world > 1:
            if smaller is None:
                raise GrowlmError(f"rank {rank}: CUDA out of memory with the smallest plan ({message})")
            if plan_path is not None:
                write_plan(smaller, plan_path)
            print(f"growlm torchrun: rank {rank}: CUDA out of memory ({message}); wrote the next smaller plan to "
                  f"{plan_path}: {smaller.describe()}. Rerun to resume from the last checkpoint.",
                  file=sys.stderr, flush=True)
            os._exit(1)  # the other ranks wait in collectives: torchrun stops them
        if smaller is None:
            raise GrowlmError(f"out of memory with the smallest setting the planner has ({plan.describe()}): "
                              f"{message}. Use more or larger devices, or a smaller model or context")
        log(f"CUDA out of memory with {plan.describe()} ({message}); re-planned: {smaller.describe()}; "
            f"resuming from the last checkpoint in {ckpt_dir}")
        plan = smaller
        if plan_path is not None:
            write_plan(plan, plan_path)


# ----------------------------------------------------------------------------------------------
# the training job
# ----------------------------------------------------------------------------------------------

@dataclass
class TrainingJob:
    """One training job, as `run_job` runs it (and as JSON, for the processes of a torchrun launch).

    `start`: what is trained - `{"build": {...}}`, the keyword arguments of `growlm.model.build_model`
    with its `seed` (a new model), or `{"grown": DIR, "ramps": {...}}`, a grown model as
    `growlm.growth.save_grown` wrote it with its mask-ramp lengths (a refinement); `run_job` and
    `execute` also take a model already in memory instead (one process). `shard`: the part of the
    training tokens a member takes (`[index, count]`, or `{"index", "count"}` for a cluster of books).
    `info`: what the job adds to the saved model's growlm.json (its role, seeds...). The files default
    to the checkpoint folder beside the model (`growlm.checkpoint.checkpoint_dir_for`)."""

    cfg: TrainConfig
    out_dir: str
    train_file: str
    val_file: str
    tokenizer_dir: str | None = None
    start: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    shard: list | dict | None = None
    memory_limit_gb: float | None = None
    gpu_share: float = 1.0
    ckpt_dir: str | None = None
    plan_file: str | None = None  # default CKPT/plan.json, made by run_job
    ledger_file: str | None = None  # default CKPT/ledger.csv (copied beside the saved model)
    summary_file: str | None = None  # where rank 0 writes train()'s summary (a launch reads it there)
    plugins: list = field(default_factory=list)  # grow.plugins files whose refiners the run uses
    keep_before_decay: bool = False  # a member under wsd: keep its model where the decay began (BEFORE_DECAY)
    # wsd: {point: step} where the run keeps its state for a cooldown branch, moved to out_dir/branches/b<point>/state
    keep_at: dict = field(default_factory=dict)
    start_from: str | None = None  # a cooldown branch: the state it leaves from (another run's kept state)
    start_cfg: dict | None = None  # ... and that run's settings (TrainConfig.to_dict), which the state must match
    save: bool = True  # save the trained model (a cooldown branch keeps its ledger only)

    def __post_init__(self):
        self.ckpt_dir = str(self.ckpt_dir or checkpoint.checkpoint_dir_for(self.out_dir))
        self.plan_file = str(self.plan_file or Path(self.ckpt_dir) / PLAN_FILE)
        self.ledger_file = str(self.ledger_file or Path(self.ckpt_dir) / "ledger.csv")
        for name in ("out_dir", "train_file", "val_file", "tokenizer_dir", "summary_file"):
            if getattr(self, name) is not None:
                setattr(self, name, str(getattr(self, name)))

    def to_json(self) -> str:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return json.dumps({**data, "cfg": self.cfg.to_dict()}, indent=2, default=str)

    @classmethod
    def from_json(cls, text: str) -> "TrainingJob":
        data = json.loads(text)
        return cls(**{**data, "cfg": TrainConfig.from_dict(data["cfg"])})

    def shape(self, model: torch.nn.Module | None = None) -> ModelShape:
        if model is not None:
            return ModelShape.of(model)
        if "build" in self.start:
            return ModelShape.of({k: v for k, v in self.start["build"].items() if k != "seed"})
        return ModelShape.of(load_grown(self.start["grown"]))


def identify_inputs(job: TrainingJob) -> dict:
    """The sha256 of every file the run reads and the part of the data it takes (`TrainConfig.inputs`),
    so that its checkpoints resume only a run with the same data (`growlm.checkpoint.run_identity`):
    after the corpus, the tokenizer, the levels or `members.data` changed, a rerun starts over. The
    refiners' files (`growlm.refiners`: teachers, masks, moments) count too."""
    inputs = {"training tokens": digest(job.train_file), "validation tokens": digest(job.val_file),
              "tokenizer": digest(Path(job.tokenizer_dir) / "tokenizer.json"),
              "part of the training tokens": json.dumps(job.shard, sort_keys=True)}
    for name, settings in sorted((job.cfg.refiners or {}).items()):
        inputs.update(REFINERS[name].identify(settings))
    return inputs


def job_tokens(job: TrainingJob, log=job_log):
    """The job's training tokens: all of them, or the member's shard or cluster of books - checked
    against one training window, named by the setting that made it (a warning in the terminal when
    the budget reads it very often)."""
    tokens, shard = load_tokens(job.train_file), job.shard
    if shard is None:
        return tokens
    if isinstance(shard, dict):  # members.data: clusters - the member's cluster of books
        tokens = take_cluster(tokens, token_sources(job.train_file), shard["index"], shard["count"])
        log(f"cluster {shard['index'] + 1} of {shard['count']}: "
            f"{', '.join(book_clusters(token_sources(job.train_file), shard['count'])[shard['index']])}")
    else:
        tokens = take_shard(tokens, *shard)
    what = "cluster of books" if isinstance(shard, dict) else "shard"
    count = shard["count"] if isinstance(shard, dict) else shard[1]
    context, budget = job.cfg.context, job.cfg.tokens
    if tokens.size < context + 1:
        raise GrowlmError(f"members.shards = {count}: this member's {what} holds {tokens.size} tokens, fewer "
                          f"than one training window of {context + 1} (model.context + 1); use fewer shards")
    if budget / tokens.size > 20 and log is job_log:
        warn(f"members.shards = {count}: this member's {what} holds {tokens.size} tokens, so its budget of "
             f"{budget} tokens reads it {budget / tokens.size:.0f} times")
    return tokens


def _starter(job: TrainingJob, model: torch.nn.Module | None) -> tuple[Callable[[], torch.nn.Module], list]:
    """A function that returns the job's model with its initial weights (on every attempt of
    `train_with_replanning`), and a list that holds the last one it returned (the trained model)."""
    made: list = []
    if model is not None:
        initial = copy.deepcopy(model.state_dict())  # a re-planned attempt starts from these weights

        def fresh():
            model.load_state_dict(initial)
            return model
    elif "build" in job.start:
        def fresh():
            spec = dict(job.start["build"])
            return build_model(seed=spec.pop("seed", 0), **spec)
    else:
        def fresh():
            grown = load_grown(job.start["grown"])
            if job.start.get("ramps") and hasattr(grown, "set_ramps"):
                grown.set_ramps(**job.start["ramps"])
            return grown

    def remembered():
        made[:] = [fresh()]
        return made[0]

    return remembered, made


def execute(job: TrainingJob, *, model: torch.nn.Module | None = None, log=job_log) -> dict:
    """What every process of a training job does (see the module docstring): build or load the model,
    train it under the job's plan on its tokens, save it (rank 0 writes; FSDP2's shards gathered).
    Returns train()'s summary, with where each process ran (`growlm.distributed.ranks_where`) under
    "where". Under torchrun every process calls it; in one process, `run_job` does."""
    launched = "LOCAL_RANK" in os.environ  # a process of a torchrun launch
    load_plugins(job.plugins)  # a plugin's refiners, in every process
    rank, world, device = init_process_group(job.cfg.device) if launched else (0, 1, job.cfg.device)
    say = log if rank == 0 else (lambda *_: None)
    where = ranks_where(device)
    if world > 1:
        say(f"{world} processes on {len(where['nodes'])} node{'s' if len(where['nodes']) > 1 else ''}: "
            + "; ".join(f"rank {r['rank']} on {r['node']} ({r['device']})" for r in where["ranks"]))
    limit_gpu_memory(device, job.gpu_share)
    plan = read_plan(job.plan_file)
    if plan.n_devices != world:
        raise GrowlmError(f"the plan {job.plan_file} is for {plan.n_devices} devices, this job runs {world} processes")
    if model is not None and world > 1:
        raise GrowlmError("a model in memory trains in one process; save it and start from its folder")
    fresh, made = _starter(job, model)
    start_cfg = TrainConfig.from_dict(job.start_cfg, device=device) if job.start_cfg else None
    summary = train_with_replanning(fresh, job_tokens(job, say), load_tokens(job.val_file),
                                    job.cfg.with_(device=device), plan, ckpt_dir=job.ckpt_dir,
                                    ledger_path=job.ledger_file, plan_path=job.plan_file, log=say, world=world,
                                    rank=rank, keep_at={step: checkpoint.BRANCH_PREFIX + p for p, step in job.keep_at.items()},
                                    start_from=job.start_from, start_cfg=start_cfg)
    summary["world"] = world
    summary["where"] = where
    trained = made[0]
    if hasattr(trained, "to_plain") and job.save:  # a grown model with growth masks: a plain model by now
        trained = trained.to_plain()
    if job.save:
        save_full_model(trained, job.out_dir, tokenizer_dir=job.tokenizer_dir,
                        extra={**job.info, "processes": world, "where": where, "train": summary})
    Path(job.out_dir).mkdir(parents=True, exist_ok=True)
    if rank == 0:
        shutil.copy(job.ledger_file, Path(job.out_dir) / "ledger.csv")
        if windows_path(job.ledger_file).is_file():  # the last evaluation's window losses, beside the ledger
            shutil.copy(windows_path(job.ledger_file), windows_path(Path(job.out_dir) / "ledger.csv"))
        if job.summary_file:
            Path(job.summary_file).parent.mkdir(parents=True, exist_ok=True)
            Path(job.summary_file).write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _launch(job: TrainingJob, run: Callable[[Path], int], what: str) -> dict:
    """Run the job's processes (`run(JOB.json)`: `growlm.launch` starts torchrun, or srun of a node agent per
    node) and read the summary rank 0 wrote. Their output goes to the job's log, as a one-process job's
    does; they hold the job's GPUs and stop with it (`growlm.processes.run_processes`)."""
    ckpt = Path(job.ckpt_dir)
    job.summary_file = str(ckpt / "summary.json")
    (ckpt / "job.json").write_text(job.to_json())
    rc = run(ckpt / "job.json")
    if rc != 0:
        raise GrowlmError(f"{what} failed (exit {rc}); the job resumes from {ckpt} when rerun")
    return json.loads(Path(job.summary_file).read_text())


def run_job(job: TrainingJob, *, nproc: int = 1, nodes: int = 1, cpus_per_task: int = 0, gpus_per_node: int = 0,
            model: torch.nn.Module | None = None, log=job_log) -> dict:
    """Run a training job with `nproc` processes on each of `nodes` nodes (see the module docstring):
    plan, train, save, then copy the plan beside the model and remove the finished run's checkpoints.
    One process: in this one; several on this machine: torchrun; several nodes: one torchrun agent per
    node of this SLURM job, started with srun (`growlm.launch`; `cpus_per_task` and `gpus_per_node` are
    what each node's task asks of it). `model`: the starting model, if the caller has it in memory:
    trained in place in one process; with several, only its shape is read (every process builds or loads
    `job.start`). Returns train()'s summary."""
    ckpt = Path(job.ckpt_dir)
    ckpt.mkdir(parents=True, exist_ok=True)
    job.cfg.inputs = identify_inputs(job)
    shape = job.shape(model)
    world = nproc * nodes
    alloc = job_allocation(nodes)  # before any work: outside SLURM, or other nodes than asked, one line saying so
    limit_gpu_memory(job.cfg.device, job.gpu_share)
    _, plan_path = job_plan(shape, job.cfg, ckpt, n_devices=world, memory_limit_gb=job.memory_limit_gb,
                            gpu_share=job.gpu_share, log=log)
    job.plan_file = str(plan_path)
    where = (f"{nodes} nodes x {nproc} process{'es' if nproc > 1 else ''}" if nodes > 1
             else f"{nproc} processes" if nproc > 1 else job.cfg.device)
    log(f"training {job.info.get('role')} ({shape.n_params} parameters) for {job.cfg.steps} steps of "
        f"{job.cfg.batch_size}x{job.cfg.context} tokens on {where}, {job.cfg.schedule_text()} schedule"
        f"{'' if job.cfg.decay_start is None else f' decaying from step {job.cfg.decay_start}'}; checkpoints in {ckpt}")
    if world > 1 and not job.start:
        raise GrowlmError("a model in memory trains in one process; save it and start from its folder")
    if alloc is not None:
        summary = _launch(job, lambda f: run_across_nodes(alloc, job_file=f, work_dir=ckpt, log=log,
                                                          nproc_per_node=nproc, cpus_per_task=cpus_per_task,
                                                          gpus_per_node=gpus_per_node),
                          f"{world} processes on SLURM nodes {', '.join(alloc.nodes)}")
    elif nproc > 1:
        what = f"torchrun with {nproc} processes"
        summary = _launch(job, lambda f: run_here(standalone_command(nproc, f), log=log, what=what), what)
    else:
        summary = execute(job, model=model, log=log)
    shutil.copy(plan_path, Path(job.out_dir) / "plan.json")
    if job.keep_before_decay and job.cfg.decay_start is not None:
        save_before_decay(job, log)
    keep_branch_states(job, log)
    checkpoint.remove_finished(ckpt)
    log(f"saved {job.out_dir}; final val loss {summary.get('final_val_loss')}")
    return summary


def branch_state_dir(out_dir, point: str) -> Path:
    """Where a run's state for its cooldown branch at `point` goes: `<model folder>/branches/b<point>/state`
    (a declared output of the run's job, which the branch's job reads; growlm.envelope)."""
    return Path(out_dir) / "branches" / f"b{point}" / "state"


def keep_branch_states(job: TrainingJob, log=job_log) -> None:
    """Move the states the run kept for its cooldown branches (`keep_at`) from its checkpoint folder, which
    is removed next, to their place in the model's folder (`branch_state_dir`)."""
    for point, step in job.keep_at.items():
        src = Path(job.ckpt_dir) / f"{checkpoint.BRANCH_PREFIX}{point}"
        problem = checkpoint.verify(src) if src.is_dir() else "it was not written"
        if problem:
            raise GrowlmError(f"{job.info.get('role')}: the state kept at step {step} for its cooldown branch {point} "
                              f"({src}) is unusable ({problem}); remove {job.out_dir} and run the workflow again")
        dst = branch_state_dir(job.out_dir, point)
        shutil.rmtree(dst, ignore_errors=True)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(dst))
        log(f"kept the state at step {step} of {job.cfg.steps} for its cooldown branch {point}: {dst}")


def save_before_decay(job: TrainingJob, log=job_log) -> Path:
    """A finished wsd member's model where its decay began, as a model folder `BEFORE_DECAY` inside the
    member's (what `members.source: before_decay` grows from): the weights of the run's `DECAY_START`
    checkpoint, its ledger up to there (ending with the evaluation made at that step), the AdamW moments
    then (for carry) and a growlm.json whose training cost is what was trained up to there - FLOPs,
    tokens and wall time (compilation apart) at that step - so that the comparison counts exactly that.
    The checkpoint belongs to this very run: the loop writes it when it passes the step, and a resume
    from another run's checkpoints removes it with them (`growlm.checkpoint.load_latest`)."""
    snap = Path(job.ckpt_dir) / checkpoint.DECAY_START
    problem = checkpoint.verify(snap) if snap.is_dir() else "it was not written"
    if problem:
        raise GrowlmError(f"{job.info.get('role')}: the checkpoint where its wsd decay begins ({snap}) is unusable "
                          f"({problem}); remove {job.out_dir} and run the workflow again to retrain it")
    model = load_model(job.out_dir)  # the member's architecture, given the weights from where its decay began
    optimizer = make_optimizer(model, job.cfg.with_(device="cpu"))
    state = checkpoint.restore(snap, model, optimizer)
    last = state["rows"][-1]  # the evaluation at the decay's first step
    out = Path(job.out_dir) / BEFORE_DECAY
    info = read_json(Path(job.out_dir) / "growlm.json")
    train_info = {"steps": state["step"], "tokens": last["tokens"], "flops": last["flops"], "wall_s": state["wall_s"],
                  "compile_s": state.get("compile_s", 0.0), "final_val_loss": last["val_loss"],
                  "config": job.cfg.to_dict()}
    save_model(model, out, tokenizer_dir=job.tokenizer_dir,
               extra={**info, "train": train_info, "before_decay": {"step": state["step"], "of": job.cfg.steps,
                                                                    "annealed": str(job.out_dir)}})
    with open(out / "ledger.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=LEDGER_COLUMNS)
        w.writeheader()
        w.writerows({k: r.get(k, "") for k in LEDGER_COLUMNS} for r in state["rows"])
    if job.cfg.save_moments:
        save_moments(out / Path(job.cfg.save_moments).name, model, optimizer)
    log(f"kept the model where the decay began (step {state['step']} of {job.cfg.steps}, val loss "
        f"{last['val_loss']}): {out}")
    return out
