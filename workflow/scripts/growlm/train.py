"""The training loop every model goes through: small members, the baseline M_0, the refinement M_1.

A plain PyTorch loop: AdamW, linear warm-up then cosine decay to `min_lr_ratio * lr`, gradient
clipping, a token budget, evaluation every `eval_interval` steps, a resumable checkpoint every
`checkpoint_every` steps, and a ledger row per evaluation (plus one per step for the first
`dense_log_steps` steps, so loss spikes right after growth show). Batches depend only on
(seed, step), so on CPU a resumed run is bitwise identical to an uninterrupted one.

Grown models with growth masks (MSG, concat) expose `growth_step(step)`; the loop calls it before
every step. SIGTERM and SIGUSR1 (SLURM's pre-emption warning) make the loop write a checkpoint
after the current step and exit with status 75 so that Snakemake retries and resumes.
"""

from __future__ import annotations

import csv
import math
import os
import resource
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from growlm import checkpoint
from growlm.data import BatchSampler, eval_batches
from growlm.errors import GrowlmError
from growlm.flops import model_train_flops_per_token
from growlm.phases import phase

LEDGER_COLUMNS = ["step", "tokens", "flops", "wall_s", "lr", "train_loss", "val_loss",
                  "peak_mem_mb", "kind"]
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: "try again"


@dataclass
class TrainConfig:
    tokens: int  # budget: training tokens for this job
    batch_size: int = 16
    context: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 50
    eval_tokens: int = 16384
    checkpoint_every: int = 100
    dense_log_steps: int = 0
    seed: int = 0
    device: str = "cpu"
    micro_batch_size: int | None = None  # gradient accumulation: the global batch stays batch_size
    gradient_checkpointing: bool = False  # recompute activations in the backward pass
    extra: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return max(1, self.tokens // (self.batch_size * self.context))

    def validate(self) -> None:
        if self.tokens < self.batch_size * self.context:
            raise GrowlmError(f"token budget {self.tokens} is smaller than one batch "
                              f"({self.batch_size} x {self.context})")
        if self.lr <= 0:
            raise GrowlmError(f"learning rate must be positive, got {self.lr}")
        world = _world()[1]
        if self.batch_size % world:
            raise GrowlmError(f"batch_size {self.batch_size} is not divisible by the {world} processes")
        mb = self.micro_batch_size or self.batch_size // world
        if (self.batch_size // world) % mb:
            raise GrowlmError(f"micro_batch_size {mb} does not divide the per-process batch "
                              f"{self.batch_size // world}")


def _world() -> tuple[int, int]:
    """(rank, world size) under torch.distributed (torchrun), else (0, 1)."""
    import torch.distributed as dist

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
    fused = cfg.device.startswith("cuda")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean next-token cross entropy and the logits."""
    logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
    return loss, logits


@torch.no_grad()
def evaluate(model: torch.nn.Module, tokens: np.ndarray, *, context: int, batch_size: int = 16,
             max_tokens: int | None = None, device: str = "cpu") -> dict:
    """Held-out loss (nats/token), perplexity and next-token accuracy over non-overlapping windows."""
    was_training = model.training
    model.eval()
    total_loss, total_correct, total = 0.0, 0, 0
    for x, y in eval_batches(tokens, batch_size=batch_size, context=context, max_tokens=max_tokens):
        x, y = x.to(device), y.to(device)
        logits = model(input_ids=x).logits.float()
        total_loss += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                      reduction="sum").item()
        total_correct += (logits.argmax(-1) == y).sum().item()
        total += y.numel()
    model.train(was_training)
    loss = total_loss / total
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "accuracy": total_correct / total,
            "tokens": total}


def peak_memory_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


class _StopRequest:
    """Remembers a SIGTERM/SIGUSR1 so the loop can checkpoint and exit between steps."""

    def __init__(self):
        self.signal = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGUSR1):
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


def _write_ledger(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=LEDGER_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in LEDGER_COLUMNS})
    os.replace(tmp, path)


def train(model: torch.nn.Module, train_tokens: np.ndarray, val_tokens: np.ndarray, cfg: TrainConfig,
          *, ckpt_dir: str | Path, ledger_path: str | Path, log=print, step_callback=None) -> dict:
    """Train `model` in place for `cfg.tokens` tokens; write the ledger; return a summary dict.

    Resumes from the newest whole checkpoint in `ckpt_dir` if there is one.
    """
    cfg.validate()
    device = cfg.device
    rank, world = _world()
    model.to(device)
    model.train()
    core = getattr(model, "module", model)  # unwrap DDP
    config = core.config
    if cfg.gradient_checkpointing and hasattr(core, "gradient_checkpointing_enable"):
        core.gradient_checkpointing_enable()
    local_batch = cfg.batch_size // world
    micro = cfg.micro_batch_size or local_batch
    flops_per_token = model_train_flops_per_token(config, cfg.context)
    tokens_per_step = cfg.batch_size * cfg.context
    sampler = BatchSampler(train_tokens, batch_size=cfg.batch_size, context=cfg.context, seed=cfg.seed)
    optimizer = make_optimizer(model, cfg)
    ledger_path = Path(ledger_path)
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    use_bf16 = device.startswith("cuda") and torch.cuda.is_bf16_supported()

    state = checkpoint.load_latest(ckpt_dir, model, optimizer, log=log)
    if state is None:
        state = {"step": 0, "wall_s": 0.0, "rows": []}
    rows: list[dict] = state["rows"]
    start_step, wall_before = state["step"], state["wall_s"]
    t0 = time.perf_counter()

    def wall() -> float:
        return wall_before + time.perf_counter() - t0

    def record(step: int, train_loss: float | None, kind: str) -> dict:
        row = {"step": step, "tokens": step * tokens_per_step, "flops": step * tokens_per_step * flops_per_token,
               "wall_s": round(wall(), 3), "lr": lr_at(max(step - 1, 0), cfg),
               "train_loss": "" if train_loss is None else round(train_loss, 5), "val_loss": "",
               "peak_mem_mb": round(peak_memory_mb(device), 1), "kind": kind}
        if kind == "eval":
            with phase("eval"):
                metrics = evaluate(model, val_tokens, context=cfg.context, batch_size=cfg.batch_size,
                                   max_tokens=cfg.eval_tokens, device=device)
            row["val_loss"] = round(metrics["loss"], 5)
        rows.append(row)
        return row

    if start_step == 0 and not rows:
        if hasattr(model, "growth_step"):
            model.growth_step(0)
        row = record(0, None, "eval")
        log(f"step 0/{cfg.steps}: val_loss {row['val_loss']:.4f}")

    running, step = None, start_step
    with _StopRequest() as stop:
        for step in range(start_step, cfg.steps):
            if hasattr(model, "growth_step"):
                model.growth_step(step)
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with phase("data"):
                x, y = sampler.batch(step)  # the global batch; this process takes its rows
                x, y = x[rank * local_batch:(rank + 1) * local_batch], y[rank * local_batch:(rank + 1) * local_batch]
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss_value = 0.0
            for i in range(0, local_batch, micro):
                with phase("forward"), torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
                    loss, _ = lm_loss(model, x[i:i + micro], y[i:i + micro])
                    loss = loss * (micro / local_batch)
                with phase("backward"):
                    loss.backward()
                loss_value += loss.item()
            if world > 1:
                t = torch.tensor([loss_value], device=device)
                torch.distributed.all_reduce(t)
                loss_value = t.item() / world
            if not math.isfinite(loss_value):
                _write_ledger(ledger_path, rows)
                raise GrowlmError(f"loss is {loss_value} at step {step + 1}; training stopped. "
                                  f"The last good checkpoint is kept in {ckpt_dir}")
            with phase("optimizer"):
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            running = loss_value if running is None else 0.9 * running + 0.1 * loss_value
            done = step + 1
            is_eval = done % cfg.eval_interval == 0 or done == cfg.steps
            if is_eval:
                row = record(done, running, "eval")
                log(f"step {done}/{cfg.steps}: train_loss {running:.4f} val_loss {row['val_loss']:.4f} "
                    f"lr {lr:.2e} wall {row['wall_s']:.1f}s")
            elif done <= cfg.dense_log_steps:
                record(done, loss_value, "train")
            if done % cfg.checkpoint_every == 0 or stop.signal is not None:
                _write_ledger(ledger_path, rows)
                checkpoint.save_checkpoint(ckpt_dir, done, model, optimizer,
                                           {"step": done, "wall_s": wall(), "rows": rows})
            if step_callback is not None:
                step_callback(done)
            if stop.signal is not None:
                log(f"received signal {stop.signal} after step {done}: checkpoint written, exiting "
                    f"with status {PREEMPTED_EXIT} so that the job is retried and resumes")
                sys.exit(PREEMPTED_EXIT)
    _write_ledger(ledger_path, rows)
    final = rows[-1]
    return {"steps": cfg.steps, "tokens": cfg.steps * tokens_per_step,
            "flops": cfg.steps * tokens_per_step * flops_per_token, "wall_s": wall(),
            "final_val_loss": final["val_loss"], "flops_per_token": flops_per_token,
            "config": asdict(cfg)}
