"""The training loop every model goes through: small members, the baseline M_0, the refinement M_1.

A plain PyTorch loop: AdamW, linear warm-up then cosine decay to `min_lr_ratio * lr` (or wsd: the
peak held, then a decay at the end; `TrainConfig.lr_at`), gradient clipping, a token budget,
evaluation every `eval_interval` steps, a resumable checkpoint every `checkpoint_every` steps, and a
ledger row per evaluation (plus one per step for the first `dense_log_steps` steps, so loss spikes
right after growth show). Batches depend only on (seed, step), so on CPU a resumed run is bitwise
identical to an uninterrupted one in the same mode (`growlm.modes`: torch.compile and the CPU threads
change the last digits; every ledger row names its mode, and a resume in another mode says so). Under
wsd the run is also evaluated where its decay begins and keeps a checkpoint there
(`checkpoint.DECAY_START`, beside the others), from which a member is grown before its decay
(`growlm.runner.save_before_decay`). Each evaluation reads the validation split's first `eval_tokens` and
records its standard error (`growlm.loss.mean_and_se`); the last reads `final_eval_tokens` (default: the whole
split), so every run's final loss is precise; its seconds are measurement, not training (not in `wall_s`).

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
import resource
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from growlm import checkpoint, hints, modes
from growlm.atomic import atomic_path
from growlm.console import log as console_log, warn
from growlm.data import BatchSampler
from growlm.devices import device_name, mfu, peak_flops
from growlm.envelope import windows_path
from growlm.errors import GrowlmError
from growlm.flops import model_train_flops_per_token
from growlm.live import from_env as live_from_env
from growlm.loss import lm_loss, validation_loss
from growlm.model import enable_recompute
from growlm.optim_state import save_moments
from growlm.profiling.ranges import phase, session_from_env
from growlm.refiners import build as refiners_from
from growlm.sync import PendingLosses
from growlm.train_config import TrainConfig

# wall_s: seconds since the run began (evaluations and compilation included); compile_s: the part of them
# torch.compile spent compiling (0 without compile), which the comparison leaves out of its wall ratios;
# mode: how the steps up to the row were computed (growlm.modes: compile and CPU threads change the last digits);
# val_loss_se: val_loss's standard error (growlm.loss.mean_and_se); val_tokens: the validation tokens read (the last
# row: final_eval_tokens); val_loss_curve: the loss on the first eval_tokens, which every evaluation reads
LEDGER_COLUMNS = ["step", "tokens", "flops", "wall_s", "compile_s", "lr", "train_loss", "val_loss", "val_loss_se",
                  "val_tokens", "val_loss_curve", "peak_mem_mb", "kind", "mode"]
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: "try again"
PROGRESS_EVERY_S = 10.0  # at most this long between two progress lines in the log


# torch.compile's backend for the training steps: None is torch's own (inductor); growlm.compile_check
# traces with "eager" (dynamo's graphs, guards and recompilations, without generating code)
COMPILE_BACKEND: str | None = None


def _world() -> tuple[int, int]:
    """(rank, world size) under torch.distributed (torchrun), else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The rate of `step` under the run's schedule (`TrainConfig.lr_at`: cosine or wsd)."""
    return cfg.lr_at(step)


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


def _write_ledger(path: Path, rows: list[dict]) -> None:
    if _world()[0] != 0:  # under torchrun only rank 0 writes files
        return
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=LEDGER_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in LEDGER_COLUMNS})


def _nan_advice(ckpt_dir, cfg: TrainConfig) -> str:
    """What the NaN message says about checkpoints: what is really in `ckpt_dir`."""
    kept = sorted(Path(ckpt_dir).glob("step_*"))
    if not kept:
        return (f"No checkpoint was written before it (the first comes at step {cfg.checkpoint_every}). Lower the "
                f"peak learning rate ({cfg.lr:g}) or check the data, then run the workflow again (`{hints.again()}`).")
    return (f"The checkpoint of step {int(kept[-1].name.split('_')[1])} is kept in {ckpt_dir}, but a rerun with "
            f"the same settings resumes there and meets the same loss; lower the peak learning rate ({cfg.lr:g}) "
            f"or tighten train.grad_clip, then run the workflow again (`{hints.again()}`; the job then starts over).")


class Run:
    """Everything one training run needs, set up once (`setup`), and each thing the loop does in a step
    as a method: the loop (`train`) reads in one sitting and knows nothing of refinement operators,
    growth masks or devices beyond what these methods do.

    Set-up: the model on its device (activation recomputation as the memory plan says), the batches,
    AdamW, torch.compile, the refiners (`growlm.refiners`), the checkpoint this very run left (a
    checkpoint resumes only a run with the same settings, initial weights and data: its identity), the
    ledger rows so far and the live curves. `flops(step)`: the training FLOPs after `step` steps, the
    model's and the refiners', computed here once for the ledger, the live curves and the summary."""

    def __init__(self, model, train_tokens, val_tokens, cfg: TrainConfig, *, ckpt_dir, ledger_path, log, live,
                 keep_at: dict | None = None, start_from=None, start_cfg: TrainConfig | None = None):
        self.rank, self.world = _world()
        cfg.validate(self.world)
        self.cfg, self.log, self.val_tokens = cfg, log, val_tokens
        self.device = cfg.device
        if not getattr(model, "_growlm_cpu_offload", False):  # FSDP2 + CPU offload keeps its shards on the CPU
            model.to(self.device)
        model.train()
        self.model, self.core = model, getattr(model, "module", model)  # DDP unwrapped
        if cfg.recompute_every and hasattr(self.core, "gradient_checkpointing_enable"):
            enable_recompute(self.core, every=cfg.recompute_every)  # every k-th block, as the memory plan says
        self.local_batch = cfg.batch_size // self.world
        self.micro = cfg.micro_batch_size or self.local_batch
        self.flops_per_token = model_train_flops_per_token(self.core.config, cfg.context)
        self.tokens_per_step = cfg.batch_size * cfg.context
        self.sampler = BatchSampler(train_tokens, batch_size=cfg.batch_size, context=cfg.context, seed=cfg.seed)
        self.optimizer = make_optimizer(model, cfg)
        self.ckpt_dir, self.ledger_path = ckpt_dir, Path(ledger_path)
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        self.use_bf16 = self.device.startswith("cuda") and torch.cuda.is_bf16_supported()
        self.gpu_settings = _gpu_settings(cfg, self.use_bf16)
        # the training steps' forward, compiled once per module it runs (`step_model`)
        self._compiled: dict[int, torch.nn.Module] = {}
        self.compile_s, self._compiling, self._held = 0.0, None, None
        if cfg.compile_mode:  # a run compiles its own structures: nothing cached by an earlier run of this process
            torch._dynamo.reset()  # (the V-cycle's stages, each a model of another shape)
        self.refiners = refiners_from(cfg.refiners)
        self.identity = checkpoint.run_identity(model, cfg.run_settings(), cfg.inputs)
        self.run_id = checkpoint.fingerprint(self.identity)
        # the states kept for cooldown branches ({step: name}): a resume never passes one that is not kept
        self.keep_at = {int(k): v for k, v in (keep_at or {}).items()}
        unkept = [k for k, name in self.keep_at.items() if not checkpoint.verify_named(ckpt_dir, name)]
        state = checkpoint.load_latest(ckpt_dir, model, self.optimizer, log=log, identity=self.identity,
                                       at_most=min(unkept) if unkept else None)
        if state is None and start_from is not None:  # a cooldown branch: from the state of the run it leaves
            theirs = checkpoint.run_identity(model, start_cfg.run_settings(), cfg.inputs)
            state = checkpoint.start_branch(start_from, model, self.optimizer, identity=theirs, step=cfg.decay_start)
            log(f"branching from {start_from} at step {state['step']}: a cooldown to step {cfg.steps}")
        resumed = state is not None
        state = state or {"step": 0, "wall_s": 0.0, "rows": [], "running": None}
        self.rows: list[dict] = state["rows"]
        self.start_step, self.wall_before = state["step"], state["wall_s"]
        self.running = state.get("running")  # the training loss's running average: a resume continues it
        self.compile_before = state.get("compile_s", 0.0)
        self.mode = modes.run_mode(self.device, cfg.compile_mode, threads=torch.get_num_threads(), world=self.world,
                                   ramps=cfg.compile_ramps if hasattr(self.core, "ramp_done") else None)
        changed = modes.resume_line(state.get("mode"), self.mode, self.start_step)  # None: the same, or fresh
        if changed and not self.rank:  # in the terminal too, as a job's surprising settings are
            (warn if log is console_log else log)(changed)
        for r in self.refiners:
            r.setup(self)
            if resumed:
                r.load(state.get("refiners", {}).get(r.name, {}))
            else:
                r.start(self)
        self.live = live if live is not None or self.rank else live_from_env(self.flops)
        self.progress = _Progress(cfg.steps, self.tokens_per_step, log, self.start_step, self.live)
        self.step_s, self.steps_timed, self.last_loss, self.final_eval_s = 0.0, 0, None, 0.0
        self.t0 = time.perf_counter()

    @property
    def step_model(self) -> torch.nn.Module:
        """The module a training step runs, compiled when `train.compile` asks: in one process a grown
        model's `stepping_module` (itself while its ramps run, its plain inner model after: the very
        function M_0's steps compute, with M_0's fused head-and-loss on a CPU), else the model as set
        up (DDP's wrapper included). Each module is compiled once, when first run; the values that
        change from step to step reach it as tensors (`growlm.growth.masked`), so it never recompiles
        (tests/test_compile.py). The masked form runs eagerly unless `compile_ramps`: compiling it costs
        more than the recipes' 48-100 ramp steps gain (docs/gpu-and-clusters.md)."""
        module = getattr(self.core, "stepping_module", self.core) if self.model is self.core else self.model
        if not self.cfg.compile_mode:
            return module
        if not self.cfg.compile_ramps and not getattr(self.core, "ramp_done", True):
            return module  # the ramps' steps, eagerly (under DDP too: its wrapper compiles once they are done)
        if id(module) not in self._compiled:
            self._compiled[id(module)] = (torch.compile(module, mode=self.cfg.compile_mode) if COMPILE_BACKEND is None
                                          else torch.compile(module, backend=COMPILE_BACKEND))
            self._compiling = module  # this step compiles it: its time beyond a plain step's is compile time
        return self._compiled[id(module)]

    def count_compile(self, seconds: float) -> bool:
        """Account a step of `seconds`: what a step that compiled a module took beyond the next plain step
        is compile time (the ledger's compile_s; counted whole until that step). Returns whether this
        step compiled (it is then not timed for the MFU either)."""
        if self._compiling is not None:  # counted whole until the next step says what a plain step takes
            self._compiling, self._held = None, seconds
            self.compile_s += seconds
            return True
        if self._held is not None:
            self.compile_s -= min(self._held, seconds)
            self._held = None
        return False

    def compile_time(self) -> float:
        return self.compile_before + self.compile_s

    def flops(self, step: int) -> int:
        return step * self.tokens_per_step * self.flops_per_token + sum(
            r.flops(step, self.tokens_per_step) for r in self.refiners)

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.t0

    # -- a step ---------------------------------------------------------------------------------
    def begin_step(self, step: int) -> float:
        """Growth masks' ramps and the learning rate for `step`; returns the rate."""
        if hasattr(self.core, "growth_step"):
            self.core.growth_step(step)
        lr = lr_at(step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def forward_backward(self, step: int) -> list[torch.Tensor]:
        """The step's batch (this process's rows) in micro-batches: each one's loss (a refiner's, or the
        plain LM loss) backpropagated; the losses stay on the device."""
        with phase("data"):
            x, y = self.sampler.batch(step)  # the global batch; this process takes its rows
            rows = slice(self.rank * self.local_batch, (self.rank + 1) * self.local_batch)
            x, y = _to_device(x[rows], self.device), _to_device(y[rows], self.device)
        losses = []
        for i in range(0, self.local_batch, self.micro):
            # DDP: all-reduce the gradients once per step, at the last micro-batch
            last = i + self.micro >= self.local_batch or not hasattr(self.model, "no_sync")
            with contextlib.nullcontext() if last else self.model.no_sync():
                with phase("forward"), torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.use_bf16):
                    xb, yb = x[i:i + self.micro], y[i:i + self.micro]
                    loss = next((v for v in (r.loss(self, step, xb, yb) for r in self.refiners) if v is not None),
                                None)
                    if loss is None:
                        loss = lm_loss(self.step_model, xb, yb, logits=False)[0]
                    loss = loss * (self.micro / self.local_batch)
                with phase("backward"):
                    loss.backward()
            losses.append(loss.detach())  # read later, at a sync point (no host sync here)
        return losses

    def optimizer_step(self, step: int) -> None:
        with phase("optimizer"):
            for r in self.refiners:
                r.before_step(step)
            if self.cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            for r in self.refiners:
                r.after_step(step)

    def read_losses(self, pending: PendingLosses, stop_requested: bool) -> bool:
        """Read the pending losses (in step order, as if each had been read at its step) into the running
        average; a non-finite one stops the run naming its step. Returns whether to stop (any rank)."""
        values, stopping = pending.read(stop_requested, self.world, self.device)
        for at, value in values:
            if not math.isfinite(value):
                _write_ledger(self.ledger_path, self.rows)
                raise GrowlmError(f"loss is {value} at step {at + 1}; training stopped. "
                                  + _nan_advice(self.ckpt_dir, self.cfg))
            self.running = value if self.running is None else 0.9 * self.running + 0.1 * value
            self.last_loss = value
        return stopping

    # -- the periodic actions -------------------------------------------------------------------
    def record(self, step: int, train_loss: float | None, kind: str) -> dict:
        """A ledger row (with a validation loss for kind "eval"), also to the live curves. The run's last
        evaluation reads `final_eval_tokens` (0: the whole split) and gives the curve's point beside it."""
        row = {"step": step, "tokens": step * self.tokens_per_step, "flops": self.flops(step),
               "wall_s": round(self.wall(), 3), "compile_s": round(self.compile_time(), 3), "lr": lr_at(max(step - 1, 0), self.cfg),
               "train_loss": "" if train_loss is None else round(train_loss, 5), "val_loss": "",
               "peak_mem_mb": round(peak_memory_mb(self.device), 1), "kind": kind, "mode": self.mode}
        if kind == "eval":
            final, t0 = step == self.cfg.steps, time.perf_counter()
            with phase("eval"):
                v = validation_loss(self.model, self.val_tokens, context=self.cfg.context, batch_size=self.micro,
                                    max_tokens=(self.cfg.final_eval_tokens or None) if final else self.cfg.eval_tokens,
                                    curve_tokens=self.cfg.eval_tokens, device=self.device)
            self.final_eval_s += (time.perf_counter() - t0) if final else 0.0
            if final and _world()[0] == 0:  # each window's loss beside the ledger, to compare runs on the same windows
                with atomic_path(windows_path(self.ledger_path)) as tmp, open(tmp, "wb") as fh:
                    np.save(fh, v["window_losses"])
            row.update(val_loss=round(v["loss"], 5), val_loss_se="" if math.isnan(v["se"]) else round(v["se"], 6),
                       val_tokens=v["tokens"], val_loss_curve=round(v["curve_loss"], 5))
        self.rows.append(row)
        if self.live is not None:
            self.live.row(row)
        return row

    def save_checkpoint(self, done: int, name: str | None = None) -> None:
        _write_ledger(self.ledger_path, self.rows)
        checkpoint.save_checkpoint(self.ckpt_dir, done, self.model, self.optimizer, name=name, state=
                                   {"step": done, "wall_s": self.wall(), "compile_s": self.compile_time(), "rows": self.rows, "running": self.running,
                                    "mode": self.mode,
                                    "fingerprint": self.run_id, "identity": self.identity,
                                    **({"refiners": {r.name: r.state() for r in self.refiners}}
                                       if any(r.state() for r in self.refiners) else {})})

    def stop(self, done: int, signum) -> None:
        name = signal.Signals(signum).name if signum else "a stop request on another rank"
        self.log(f"{name} after step {done}/{self.cfg.steps}: checkpoint written to {self.ckpt_dir}; exiting with "
                 f"status {PREEMPTED_EXIT}. Run the workflow again to continue from it: `{hints.again()}`")
        sys.exit(PREEMPTED_EXIT)

    def finish(self) -> dict:
        """The ledger written, the moments saved (a member's, for carry), the summary."""
        cfg = self.cfg
        _write_ledger(self.ledger_path, self.rows)
        if cfg.save_moments and self.rank == 0:
            save_moments(cfg.save_moments, self.model, self.optimizer)
        timed_flops = self.steps_timed * self.tokens_per_step * self.flops_per_token
        achieved = timed_flops / self.step_s if self.step_s > 0 else None
        if self.gpu_settings:  # model FLOPs per second of training steps over the device's bf16 peak
            self.gpu_settings["mfu"] = mfu(achieved or 0.0, self.gpu_settings["peak_flops"])
        total = self.flops(cfg.steps)
        return {"steps": cfg.steps, "tokens": cfg.steps * self.tokens_per_step, "flops": total,
                # wsd: the FLOPs up to where the decay begins (a cooldown branch's own are the rest)
                "decay_start_flops": None if cfg.decay_start is None else self.flops(cfg.decay_start),
                # what the refiners added (the teachers' forward passes), in all and by refiner
                "teacher_flops": total - cfg.steps * self.tokens_per_step * self.flops_per_token,
                "refiner_flops": {r.name: r.flops(cfg.steps, self.tokens_per_step) for r in self.refiners},
                # the last evaluation's seconds are measurement, not training (as in the ledger's last wall_s)
                "wall_s": self.wall() - self.final_eval_s, "compile_s": self.compile_time(), "final_eval_s": self.final_eval_s,
                "final_val_loss": self.rows[-1]["val_loss"], "final_val_loss_se": self.rows[-1].get("val_loss_se", ""),
                "final_val_tokens": self.rows[-1].get("val_tokens", ""),
                "flops_per_token": self.flops_per_token, "model_flops_per_s": achieved,
                "mode": modes.job_mode(r.get("mode") for r in self.rows),  # every mode its rows were computed in
                "gpu_settings": self.gpu_settings, "config": cfg.to_dict()}


def train(model: torch.nn.Module, train_tokens: np.ndarray, val_tokens: np.ndarray, cfg: TrainConfig,
          *, ckpt_dir: str | Path, ledger_path: str | Path, log=print, step_callback=None, live=None,
          keep_at: dict | None = None, start_from=None, start_cfg: TrainConfig | None = None) -> dict:
    """Train `model` in place for `cfg.tokens` tokens; write the ledger; return a summary dict.

    Resumes from the newest whole checkpoint of this very run in `ckpt_dir` if there is one. `live`: a
    `growlm.live.LiveCurves` that sees every ledger row and progress line as it is written (default:
    the one the job's environment asks for, on rank 0; `train.log_to`). `keep_at`: {step: name} of
    checkpoints kept under that name when the run passes the step (the states its cooldown branches leave
    from). A cooldown branch (`TrainConfig.branch`) starts from `start_from`, the checkpoint the run of
    settings `start_cfg` kept where this run's decay begins, and trains only its own steps after it."""
    run = Run(model, train_tokens, val_tokens, cfg, ckpt_dir=ckpt_dir, ledger_path=ledger_path, log=log, live=live,
              keep_at=keep_at, start_from=start_from, start_cfg=start_cfg)
    if run.start_step == 0 and not run.rows:  # the starting point: step 0's evaluation
        run.begin_step(0)
        run.record(0, None, "eval")
        run.progress.line(0, None, run.rows, lr_at(0, cfg))
    pending = PendingLosses()
    # a no-op unless a profiling job set GROWLM_PROFILER (growlm.profiling.driver.profile_run)
    profiler_ctx, profiler_step = session_from_env(warmup=min(3, cfg.steps // 2), steps=5)
    with _StopRequest() as stop, profiler_ctx:
        for step in range(run.start_step, cfg.steps):
            t_step = time.perf_counter()
            lr = run.begin_step(step)
            pending.add(step, run.forward_backward(step))
            run.optimizer_step(step)
            done = step + 1
            is_eval = done % cfg.eval_interval == 0 or done == cfg.steps or done == cfg.decay_start
            # -- sync: read the losses wherever a value or one decision of all ranks is needed (every
            # sync_interval steps; an evaluation, a dense ledger row, a checkpoint, the last step; a stop
            # request in one process - with several, it waits for the next sync point)
            synced = (done % cfg.sync_interval == 0 or is_eval or done <= cfg.dense_log_steps
                      or done % cfg.checkpoint_every == 0 or done == cfg.steps
                      or (run.world == 1 and stop.signal is not None))
            stopping = run.read_losses(pending, stop.signal is not None) if synced else False
            took = time.perf_counter() - t_step
            compiled_now = run.count_compile(took)
            if step > run.start_step and not compiled_now:  # the first step (allocator warm-up) and steps
                run.step_s += took                          # that compiled are not timed
                run.steps_timed += 1
            # -- evaluate and log
            if is_eval:
                run.record(done, run.running, "eval")
                run.progress.line(done, run.running, run.rows, lr)
            elif done <= cfg.dense_log_steps:
                run.record(done, run.last_loss, "train")
            if not is_eval and synced and run.progress.due():
                run.progress.line(done, run.running, run.rows, lr)
            # -- checkpoint
            if done % cfg.checkpoint_every == 0 or stopping:
                run.save_checkpoint(done)
            if done == cfg.decay_start:  # wsd: the model where its decay begins, kept apart from the others
                run.save_checkpoint(done, name=checkpoint.DECAY_START)
            if done in run.keep_at:  # wsd: a state a cooldown branch leaves from (growlm.envelope)
                run.save_checkpoint(done, name=run.keep_at[done])
            profiler_step()
            if step_callback is not None:
                step_callback(done)
            # -- stop
            if stopping:
                run.stop(done, stop.signal)
    return run.finish()
