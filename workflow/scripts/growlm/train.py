"""The training loop every model goes through: small members, the baseline M_0, the refinement M_1.

A plain PyTorch loop: AdamW, linear warm-up then cosine decay to `min_lr_ratio * lr`, gradient
clipping, a token budget, evaluation every `eval_interval` steps, a resumable checkpoint every
`checkpoint_every` steps, and a ledger row per evaluation (plus one per step for the first
`dense_log_steps` steps, so loss spikes right after growth show). Batches depend only on
(seed, step), so on CPU a resumed run is bitwise identical to an uninterrupted one.

Grown models with growth masks (MSG, concat) expose `growth_step(step)`; the loop calls it before
every step. SIGTERM, SIGUSR1 (SLURM's pre-emption warning) and SIGINT (Ctrl-C) make the loop write a
checkpoint after the current step and exit with status 75, so that a retry or the next run resumes
there. A progress line (step, tokens/s, current and best validation loss, time left) goes to the
log at every evaluation and at least every `PROGRESS_EVERY_S` seconds.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import resource
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from growlm import checkpoint, hints
from growlm.data import BatchSampler
from growlm.devices import device_name, mfu, peak_flops
from growlm.errors import GrowlmError
from growlm.flops import model_forward_flops_per_token, model_train_flops_per_token
from growlm.live import from_env as live_from_env
from growlm.loss import distill_loss, evaluate, lm_loss
from growlm.model import enable_recompute, load_model
from growlm.optim_state import apply_moments, save_moments
from growlm.profiling.ranges import phase, session_from_env
from growlm.train_config import TrainConfig

LEDGER_COLUMNS = ["step", "tokens", "flops", "wall_s", "lr", "train_loss", "val_loss",
                  "peak_mem_mb", "kind"]
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: "try again"
PROGRESS_EVERY_S = 10.0  # at most this long between two progress lines in the log


def _world() -> tuple[int, int]:
    """(rank, world size) under torch.distributed (torchrun), else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to `min_lr_ratio * lr` at the end."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, progress)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases, LayerNorm parameters (1-D) and embeddings' duplicates."""
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # the fused kernel exists for CUDA and (since torch 2.4) the CPU, where it is several times faster
    # than the per-tensor loop for the many small tensors of these models
    fused = torch.device(cfg.device).type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)


def peak_memory_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


class _StopRequest:
    """Remembers a SIGTERM, SIGUSR1 or SIGINT so the loop can checkpoint and exit between steps."""

    def __init__(self):
        self.signal = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _gpu_settings(cfg: TrainConfig, use_bf16: bool) -> dict:
    """On CUDA: TF32 for what runs in fp32 outside autocast; returns what was chosen ({} on a CPU)."""
    if torch.device(cfg.device).type != "cuda":
        return {}
    torch.set_float32_matmul_precision("high")  # TF32 matmuls
    torch.backends.cudnn.allow_tf32 = True
    return {"device_name": device_name(cfg.device), "bf16_autocast": use_bf16, "tf32": True,
            "fused_adamw": True, "pinned_memory": True, "non_blocking_copies": True,
            "compile": cfg.compile_mode or False, "sync_every": cfg.sync_interval,
            "peak_flops": peak_flops(cfg.device, cfg.peak_flops)}


def _to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """A batch to the device: through pinned memory and asynchronously on CUDA."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class _Progress:
    """The log's progress line: step/total, tokens/s, training and validation loss, time left."""

    def __init__(self, total_steps: int, tokens_per_step: int, log, start_step: int, live=None):
        self.total, self.tokens_per_step, self.log, self.live = total_steps, tokens_per_step, log, live
        self.last_t, self.last_step = time.perf_counter(), start_step

    def due(self) -> bool:
        return time.perf_counter() - self.last_t >= PROGRESS_EVERY_S

    def line(self, done: int, train_loss: float | None, rows: list[dict], lr: float) -> None:
        now = time.perf_counter()
        rate = (done - self.last_step) / (now - self.last_t) if now > self.last_t and done > self.last_step else 0.0
        evals = [(r["val_loss"], r["step"]) for r in rows if r.get("val_loss") != ""]
        val = f"val {evals[-1][0]:.4f} (best {min(evals)[0]:.4f} at step {min(evals)[1]})" if evals else "val -"
        left = f"{_duration((self.total - done) / rate)} left" if rate > 0 else ""
        self.log(" | ".join(x for x in [
            f"step {done}/{self.total} ({100 * done / self.total:.0f}%)",
            f"{rate * self.tokens_per_step:,.0f} tok/s" if rate > 0 else "",
            f"train {train_loss:.4f}" if train_loss is not None else "", val, f"lr {lr:.2e}", left] if x))
        if self.live is not None:
            self.live.progress(done, train_loss, lr, rate * self.tokens_per_step)
        self.last_t, self.last_step = now, done


class _PendingLosses:
    """The training losses of the steps since the last sync point, still on the device.

    Reading a loss on the host (`.item()`) waits until the device has finished every step queued so
    far; done at every step, it empties a GPU's launch queue once a step and the next step's kernels
    start only after the host has caught up (the launch-bound steps of small models). The loop keeps
    each step's micro-batch losses as device tensors and reads them all with one transfer at a sync
    point. The values, their order and the arithmetic on them (the step's sum of micro-batch losses,
    the ranks' mean, the running average) are those of a read at every step, so the ledger and the
    checkpoints do not depend on the interval; only how many steps later a NaN loss stops the run
    (it names the step it appeared at, and no checkpoint is written between) and how late a stop
    request reaches the other ranks.
    """

    def __init__(self):
        self.steps: list[tuple[int, list[torch.Tensor]]] = []

    def add(self, step: int, losses: list[torch.Tensor]) -> None:
        self.steps.append((step, losses))

    def read(self, stop_requested: bool, world: int, device: str) -> tuple[list[tuple[int, float]], bool]:
        """[(step, loss)] of the pending steps and whether any rank asked to stop; clears them."""
        flat = torch.stack([loss.float() for _, losses in self.steps for loss in losses]).tolist()
        sums, k = [], 0
        for _, losses in self.steps:  # a plain running sum, as one read per micro-batch adds them (not sum():
            total = 0.0               # it compensates rounding from Python 3.12 on, which would change the bits)
            for v in flat[k:k + len(losses)]:
                total += v
            sums.append(total)
            k += len(losses)
        stopping = stop_requested
        if world > 1:  # the ranks' mean loss, and one decision on a stop request for all of them
            t = torch.tensor([*sums, float(stop_requested)], device=device)
            dist.all_reduce(t)
            reduced = t.tolist()
            sums, stopping = [v / world for v in reduced[:-1]], reduced[-1] > 0
        values = [(step, v) for (step, _), v in zip(self.steps, sums)]
        self.steps = []
        return values, stopping


class _Teachers:
    """The members as teachers (the `teach` refinement operator): their logit average on a batch,
    the weight of the KL term at a step (cfg.teach_weight decaying linearly to 0 at teach_steps),
    and their forward FLOPs per token, which the ledger adds to the refinement's cost."""

    def __init__(self, cfg: TrainConfig):
        self.models = [load_model(d).to(cfg.device).eval() for d in cfg.teachers]
        for m in self.models:
            m.requires_grad_(False)
        self.cfg = cfg
        self.flops_per_token = sum(model_forward_flops_per_token(m.config, cfg.context) for m in self.models)

    def weight(self, step: int) -> float:
        if step >= self.cfg.teach_steps:
            return 0.0
        return self.cfg.teach_weight * (1.0 - step / self.cfg.teach_steps)

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return sum(m(input_ids=x).logits.float() for m in self.models) / len(self.models)

    def flops(self, step: int, tokens_per_step: int) -> int:
        """The teachers' FLOPs over the first `step` steps (they run while their weight is not 0)."""
        return min(step, self.cfg.teach_steps) * tokens_per_step * self.flops_per_token


class _Frozen:
    """The inherited entries held at their grown values for the first cfg.freeze_steps steps (the
    `freeze` refinement operator): their gradients are zeroed before the optimizer step, so AdamW's
    moments stay zero there, and their values are put back after it (AdamW's decoupled weight
    decay would move them otherwise). The new entries train as usual."""

    def __init__(self, core: torch.nn.Module, cfg: TrainConfig):
        masks = load_file(cfg.freeze_masks)
        params = dict(core.named_parameters())
        unknown = sorted(set(masks) - set(params))
        if unknown:
            raise GrowlmError(f"{cfg.freeze_masks}: masks for parameters the model does not have: {unknown[:3]}")
        self.items = []
        for name, mask in masks.items():
            p = params[name]
            mask = mask.to(device=p.device, dtype=torch.bool)
            if mask.shape != p.shape:
                raise GrowlmError(f"{cfg.freeze_masks}: mask of {name} has shape {tuple(mask.shape)}, the parameter "
                                  f"{tuple(p.shape)}")
            if mask.any():
                self.items.append((p, mask, p.detach().clone()))
        self.steps = cfg.freeze_steps

    def before_step(self, step: int) -> None:
        if step < self.steps:
            for p, mask, _ in self.items:
                if p.grad is not None:
                    p.grad.masked_fill_(mask, 0.0)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        if step < self.steps:
            for p, mask, value in self.items:
                p.copy_(torch.where(mask, value, p))


def _write_ledger(path: Path, rows: list[dict]) -> None:
    if _world()[0] != 0:  # under torchrun only rank 0 writes files
        return
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=LEDGER_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in LEDGER_COLUMNS})
    os.replace(tmp, path)


def _nan_advice(ckpt_dir, cfg: TrainConfig) -> str:
    """What the NaN message says about checkpoints: what is really in `ckpt_dir`."""
    kept = sorted(Path(ckpt_dir).glob("step_*"))
    if not kept:
        return (f"No checkpoint was written before it (the first comes at step {cfg.checkpoint_every}). Lower the "
                f"peak learning rate ({cfg.lr:g}) or check the data, then run the workflow again (`{hints.again()}`).")
    return (f"The checkpoint of step {int(kept[-1].name.split('_')[1])} is kept in {ckpt_dir}, but a rerun with "
            f"the same settings resumes there and meets the same loss; lower the peak learning rate ({cfg.lr:g}) "
            f"or tighten train.grad_clip, then run the workflow again (`{hints.again()}`; the job then starts over).")


def train(model: torch.nn.Module, train_tokens: np.ndarray, val_tokens: np.ndarray, cfg: TrainConfig,
          *, ckpt_dir: str | Path, ledger_path: str | Path, log=print, step_callback=None, live=None) -> dict:
    """Train `model` in place for `cfg.tokens` tokens; write the ledger; return a summary dict.

    Resumes from the newest whole checkpoint in `ckpt_dir` if there is one. `live`: a
    `growlm.live.LiveCurves` that sees every ledger row and progress line as it is written (default:
    the one the job's environment asks for, on rank 0; `train.log_to`).
    """
    rank, world = _world()
    cfg.validate(world)
    device = cfg.device
    if not getattr(model, "_growlm_cpu_offload", False):  # FSDP2 + CPU offload keeps its shards on the CPU
        model.to(device)
    model.train()
    core = getattr(model, "module", model)  # unwrap DDP
    config = core.config
    if cfg.recompute_every and hasattr(core, "gradient_checkpointing_enable"):
        enable_recompute(core, every=cfg.recompute_every)  # every k-th block, as the memory plan says
    local_batch = cfg.batch_size // world
    micro = cfg.micro_batch_size or local_batch
    flops_per_token = model_train_flops_per_token(config, cfg.context)
    tokens_per_step = cfg.batch_size * cfg.context
    sampler = BatchSampler(train_tokens, batch_size=cfg.batch_size, context=cfg.context, seed=cfg.seed)
    optimizer = make_optimizer(model, cfg)
    ledger_path = Path(ledger_path)
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    use_bf16 = device.startswith("cuda") and torch.cuda.is_bf16_supported()
    gpu_settings = _gpu_settings(cfg, use_bf16)
    # the training steps' forward; "reduce-overhead" also replays each step as CUDA graphs
    step_model = torch.compile(model, mode=cfg.compile_mode) if cfg.compile_mode else model
    step_s, steps_timed = 0.0, 0  # time in training steps (not evaluation), for MFU

    # a checkpoint resumes only this run: same settings (the memory plan aside), initial weights and data
    identity = checkpoint.run_identity(model, cfg.run_settings(), cfg.inputs)
    run_id = checkpoint.fingerprint(identity)
    state = checkpoint.load_latest(ckpt_dir, model, optimizer, log=log, identity=identity)
    if state is None:
        state = {"step": 0, "wall_s": 0.0, "rows": [], "running": None}
        if cfg.init_moments:
            n = apply_moments(model, optimizer, cfg.init_moments)
            log(f"AdamW starts from carried-over moments for {n} parameters ({cfg.init_moments})")
    rows: list[dict] = state["rows"]
    start_step, wall_before = state["step"], state["wall_s"]
    teachers = _Teachers(cfg) if cfg.teach_steps and cfg.teachers else None
    if cfg.freeze_steps and cfg.strategy.startswith("fsdp"):
        raise GrowlmError("freeze (inherited weights held fixed) works with one process or DDP, not with FSDP's "
                          "sharded parameters; drop freeze from the method or give the job more memory")
    frozen = _Frozen(core, cfg) if cfg.freeze_steps and start_step < cfg.freeze_steps else None
    if live is None and rank == 0:
        live = live_from_env(lambda s: s * tokens_per_step * flops_per_token
                             + (teachers.flops(s, tokens_per_step) if teachers else 0))
    t0 = time.perf_counter()

    def wall() -> float:
        return wall_before + time.perf_counter() - t0

    def record(step: int, train_loss: float | None, kind: str) -> dict:
        flops = step * tokens_per_step * flops_per_token + (teachers.flops(step, tokens_per_step) if teachers else 0)
        row = {"step": step, "tokens": step * tokens_per_step, "flops": flops,
               "wall_s": round(wall(), 3), "lr": lr_at(max(step - 1, 0), cfg),
               "train_loss": "" if train_loss is None else round(train_loss, 5), "val_loss": "",
               "peak_mem_mb": round(peak_memory_mb(device), 1), "kind": kind}
        if kind == "eval":
            with phase("eval"):
                metrics = evaluate(model, val_tokens, context=cfg.context, batch_size=micro,
                                   max_tokens=cfg.eval_tokens, device=device)
            row["val_loss"] = round(metrics["loss"], 5)
        rows.append(row)
        if live is not None:
            live.row(row)
        return row

    progress = _Progress(cfg.steps, tokens_per_step, log, start_step, live)
    if start_step == 0 and not rows:
        if hasattr(core, "growth_step"):
            core.growth_step(0)
        record(0, None, "eval")
        progress.line(0, None, rows, lr_at(0, cfg))

    # the training loss's running average is part of the run: a resumed run continues it exactly
    running, step = state.get("running"), start_step
    pending, sync_every = _PendingLosses(), cfg.sync_interval
    # a no-op unless a profiling job set GROWLM_PROFILER (growlm.profiling.driver.profile_run)
    profiler_ctx, profiler_step = session_from_env(warmup=min(3, cfg.steps // 2), steps=5)
    with _StopRequest() as stop, profiler_ctx:
        for step in range(start_step, cfg.steps):
            t_step = time.perf_counter()
            if hasattr(core, "growth_step"):
                core.growth_step(step)
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with phase("data"):
                x, y = sampler.batch(step)  # the global batch; this process takes its rows
                x, y = x[rank * local_batch:(rank + 1) * local_batch], y[rank * local_batch:(rank + 1) * local_batch]
                x, y = _to_device(x, device), _to_device(y, device)
            losses = []
            teach_weight = teachers.weight(step) if teachers else 0.0
            for i in range(0, local_batch, micro):
                # DDP: all-reduce the gradients once per step, at the last micro-batch
                last = i + micro >= local_batch or not hasattr(model, "no_sync")
                with contextlib.nullcontext() if last else model.no_sync():
                    with phase("forward"), torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
                        xb, yb = x[i:i + micro], y[i:i + micro]
                        if teach_weight > 0:
                            loss = distill_loss(step_model(input_ids=xb).logits, yb, teachers.logits(xb),
                                                weight=teach_weight, temperature=cfg.teach_temperature)
                        else:
                            loss = lm_loss(step_model, xb, yb, logits=False)[0]
                        loss = loss * (micro / local_batch)
                    with phase("backward"):
                        loss.backward()
                losses.append(loss.detach())  # read later, at a sync point (no host sync here)
            with phase("optimizer"):
                if frozen is not None:
                    frozen.before_step(step)
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if frozen is not None:
                    frozen.after_step(step)
            pending.add(step, losses)
            done = step + 1
            is_eval = done % cfg.eval_interval == 0 or done == cfg.steps
            # a sync point: wherever a loss value or one decision of all ranks is needed (every
            # sync_interval steps; an evaluation, a dense ledger row, a checkpoint, the last step; a
            # stop request in a single process - with several, it waits for the next sync point)
            if (done % sync_every == 0 or is_eval or done <= cfg.dense_log_steps or done % cfg.checkpoint_every == 0
                    or done == cfg.steps or (world == 1 and stop.signal is not None)):
                values, stopping = pending.read(stop.signal is not None, world, device)
                for at, loss_value in values:  # in step order, as if each had been read at its step
                    if not math.isfinite(loss_value):
                        _write_ledger(ledger_path, rows)
                        raise GrowlmError(f"loss is {loss_value} at step {at + 1}; training stopped. "
                                          + _nan_advice(ckpt_dir, cfg))
                    running = loss_value if running is None else 0.9 * running + 0.1 * loss_value
                synced = True
            else:
                stopping, synced = False, False
            if step > start_step:  # the first step (compilation, allocator warm-up) is not timed
                step_s += time.perf_counter() - t_step
                steps_timed += 1
            if is_eval:
                record(done, running, "eval")
                progress.line(done, running, rows, lr)
            elif done <= cfg.dense_log_steps:
                record(done, loss_value, "train")
            if not is_eval and synced and progress.due():
                progress.line(done, running, rows, lr)
            if done % cfg.checkpoint_every == 0 or stopping:
                _write_ledger(ledger_path, rows)
                checkpoint.save_checkpoint(ckpt_dir, done, model, optimizer,
                                           {"step": done, "wall_s": wall(), "rows": rows, "running": running,
                                            "fingerprint": run_id, "identity": identity})
            profiler_step()
            if step_callback is not None:
                step_callback(done)
            if stopping:
                name = signal.Signals(stop.signal).name if stop.signal else "a stop request on another rank"
                log(f"{name} after step {done}/{cfg.steps}: checkpoint written to {ckpt_dir}; exiting with status "
                    f"{PREEMPTED_EXIT}. Run the workflow again to continue from it: `{hints.again()}`")
                sys.exit(PREEMPTED_EXIT)
    _write_ledger(ledger_path, rows)
    if cfg.save_moments and rank == 0:
        save_moments(cfg.save_moments, model, optimizer)
    final = rows[-1]
    achieved = steps_timed * tokens_per_step * flops_per_token / step_s if step_s > 0 else None
    if gpu_settings:  # model FLOPs per second of training steps over the device's bf16 peak
        gpu_settings["mfu"] = mfu(achieved or 0.0, gpu_settings["peak_flops"])
    teacher_flops = teachers.flops(cfg.steps, tokens_per_step) if teachers else 0
    return {"steps": cfg.steps, "tokens": cfg.steps * tokens_per_step,
            "flops": cfg.steps * tokens_per_step * flops_per_token + teacher_flops, "teacher_flops": teacher_flops,
            "wall_s": wall(),
            "final_val_loss": final["val_loss"], "flops_per_token": flops_per_token,
            "model_flops_per_s": achieved, "gpu_settings": gpu_settings, "config": cfg.to_dict()}
