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

import contextlib
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
# TrainConfig fields that do not change what is computed (how, where, and the memory plan's choices,
# which a re-planned run changes before resuming): left out of the run's checkpoint fingerprint
RUN_ID_EXCLUDES = ("device", "micro_batch_size", "gradient_checkpointing", "compile", "peak_flops", "extra",
                   "save_moments")


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
    compile: bool = False  # torch.compile the model for the training steps (evaluation stays eager)
    peak_flops: float | None = None  # the device's dense bf16 peak for MFU; None: growlm.devices' table
    init_moments: str | None = None  # AdamW moments to start from (growlm.growth.moments, carry-over)
    save_moments: str | None = None  # write the final AdamW moments here (members, for carry-over)
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
    # the fused kernel exists for CUDA and (since torch 2.4) the CPU, where it is several times faster
    # than the per-tensor loop for the many small tensors of these models
    fused = torch.device(cfg.device).type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)


class _FusedHeadCrossEntropy(torch.autograd.Function):
    """Mean cross entropy of `h @ w.T` against `y`, in row chunks, never holding all the logits.

    The forward pass computes each chunk's logits, its loss and, at once, its gradients (softmax
    minus one-hot) with respect to `h` and `w`; the backward pass only scales them. One exp per
    logit instead of log_softmax's two passes plus its backward, no N x V logits, log-probabilities
    or zero-filled gradient: on a CPU this halves the cost of the head and loss. Deterministic (a
    fixed chunk order), so resumed runs stay bitwise identical.
    """

    @staticmethod
    def forward(ctx, h, w, y, chunk: int):
        n = h.shape[0]
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros_like(w) if want_w else None
        total = h.new_zeros((), dtype=torch.float32)
        for i in range(0, n, chunk):
            hc, yc = h[i:i + chunk], y[i:i + chunk, None]
            logits = hc @ w.t()
            target = logits.gather(1, yc)
            top = logits.amax(1, keepdim=True)
            logits.sub_(top).exp_()
            sums = logits.sum(1, keepdim=True)
            total += (sums.log() + top - target).sum()
            if want_h or want_w:
                logits.mul_(1.0 / (n * sums))  # softmax / n
                logits.scatter_add_(1, yc, logits.new_full(yc.shape, -1.0 / n))
                if want_h:
                    torch.mm(logits, w, out=grad_h[i:i + chunk])
                if want_w:
                    grad_w.addmm_(logits.t(), hc)
        ctx.save_for_backward(grad_h, grad_w)
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return (None if grad_h is None else grad_h * grad_out, None if grad_w is None else grad_w * grad_out,
                None, None)


def _fused_loss_applies(model: torch.nn.Module, x: torch.Tensor) -> bool:
    """A plain GPT2LMHeadModel (not DDP/FSDP/compiled/grown) in fp32 on the CPU, no autocast."""
    from transformers import GPT2LMHeadModel

    return (type(model) is GPT2LMHeadModel and x.device.type == "cpu" and model.lm_head.bias is None
            and model.lm_head.weight.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"))


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *,
            logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mean next-token cross entropy and the logits.

    With `logits=False` (the training loop) the logits are not returned (None), which lets a plain
    GPT2LMHeadModel on the CPU compute the head and the loss together (`_FusedHeadCrossEntropy`).
    """
    if not logits and _fused_loss_applies(model, x):
        h = model.transformer(input_ids=x).last_hidden_state
        h = h.reshape(-1, h.size(-1))
        chunk = max(64, (1 << 20) // model.lm_head.weight.shape[0])  # ~4 MB of logits per chunk
        return _FusedHeadCrossEntropy.apply(h, model.lm_head.weight, y.reshape(-1), chunk), None
    out = model(input_ids=x).logits
    # under CUDA autocast cross_entropy runs in fp32 anyway; on the CPU the logits are fp32 already
    loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
    return loss, out


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


def _gpu_settings(cfg: TrainConfig, use_bf16: bool) -> dict:
    """On CUDA: TF32 for what runs in fp32 outside autocast; returns what was chosen ({} on a CPU)."""
    from growlm.devices import device_name, peak_flops

    if torch.device(cfg.device).type != "cuda":
        return {}
    torch.set_float32_matmul_precision("high")  # TF32 matmuls
    torch.backends.cudnn.allow_tf32 = True
    return {"device_name": device_name(cfg.device), "bf16_autocast": use_bf16, "tf32": True,
            "fused_adamw": True, "pinned_memory": True, "non_blocking_copies": True,
            "compile": bool(cfg.compile), "peak_flops": peak_flops(cfg.device, cfg.peak_flops)}


def _to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """A batch to the device: through pinned memory and asynchronously on CUDA."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


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


def train(model: torch.nn.Module, train_tokens: np.ndarray, val_tokens: np.ndarray, cfg: TrainConfig,
          *, ckpt_dir: str | Path, ledger_path: str | Path, log=print, step_callback=None) -> dict:
    """Train `model` in place for `cfg.tokens` tokens; write the ledger; return a summary dict.

    Resumes from the newest whole checkpoint in `ckpt_dir` if there is one.
    """
    cfg.validate()
    device = cfg.device
    rank, world = _world()
    if not getattr(model, "_growlm_cpu_offload", False):  # FSDP2 + CPU offload keeps its shards on the CPU
        model.to(device)
    model.train()
    core = getattr(model, "module", model)  # unwrap DDP
    config = core.config
    if cfg.gradient_checkpointing and hasattr(core, "gradient_checkpointing_enable"):
        from growlm.plan import enable_checkpointing  # every k-th block if a memory plan says so

        enable_checkpointing(core, every=int(cfg.extra.get("checkpoint_every", 1)))
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
    step_model = torch.compile(model) if cfg.compile else model  # the training steps' forward
    step_s, steps_timed = 0.0, 0  # time in training steps (not evaluation), for MFU

    # a checkpoint resumes only this run: same settings (the memory plan aside) and initial weights
    run_id = checkpoint.fingerprint(model, {k: v for k, v in asdict(cfg).items() if k not in RUN_ID_EXCLUDES})
    state = checkpoint.load_latest(ckpt_dir, model, optimizer, log=log, fingerprint=run_id)
    if state is None:
        state = {"step": 0, "wall_s": 0.0, "rows": []}
        if cfg.init_moments:
            from growlm.growth.moments import apply_moments

            n = apply_moments(model, optimizer, cfg.init_moments)
            log(f"AdamW starts from carried-over moments for {n} parameters ({cfg.init_moments})")
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
                metrics = evaluate(model, val_tokens, context=cfg.context, batch_size=micro,
                                   max_tokens=cfg.eval_tokens, device=device)
            row["val_loss"] = round(metrics["loss"], 5)
        rows.append(row)
        return row

    if start_step == 0 and not rows:
        if hasattr(core, "growth_step"):
            core.growth_step(0)
        row = record(0, None, "eval")
        log(f"step 0/{cfg.steps}: val_loss {row['val_loss']:.4f}")

    running, step = None, start_step
    from growlm.profile import session_from_env

    # a no-op unless a profiling job set GROWLM_PROFILER (growlm.profile.profile_run)
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
            loss_value = 0.0
            for i in range(0, local_batch, micro):
                # DDP: all-reduce the gradients once per step, at the last micro-batch
                last = i + micro >= local_batch or not hasattr(model, "no_sync")
                with contextlib.nullcontext() if last else model.no_sync():
                    with phase("forward"), torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
                        loss = lm_loss(step_model, x[i:i + micro], y[i:i + micro], logits=False)[0]
                        loss = loss * (micro / local_batch)
                    with phase("backward"):
                        loss.backward()
                loss_value += loss.item()
            stopping = stop.signal is not None
            if world > 1:  # the mean loss, and one decision on a stop request for all ranks
                t = torch.tensor([loss_value, float(stopping)], device=device)
                torch.distributed.all_reduce(t)
                loss_value, stopping = t[0].item() / world, t[1].item() > 0
            if not math.isfinite(loss_value):
                _write_ledger(ledger_path, rows)
                raise GrowlmError(f"loss is {loss_value} at step {step + 1}; training stopped. "
                                  f"The last good checkpoint is kept in {ckpt_dir}")
            with phase("optimizer"):
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if step > start_step:  # the first step (compilation, allocator warm-up) is not timed
                step_s += time.perf_counter() - t_step
                steps_timed += 1
            running = loss_value if running is None else 0.9 * running + 0.1 * loss_value
            done = step + 1
            is_eval = done % cfg.eval_interval == 0 or done == cfg.steps
            if is_eval:
                row = record(done, running, "eval")
                log(f"step {done}/{cfg.steps}: train_loss {running:.4f} val_loss {row['val_loss']:.4f} "
                    f"lr {lr:.2e} wall {row['wall_s']:.1f}s")
            elif done <= cfg.dense_log_steps:
                record(done, loss_value, "train")
            if done % cfg.checkpoint_every == 0 or stopping:
                _write_ledger(ledger_path, rows)
                checkpoint.save_checkpoint(ckpt_dir, done, model, optimizer,
                                           {"step": done, "wall_s": wall(), "rows": rows, "fingerprint": run_id})
            profiler_step()
            if step_callback is not None:
                step_callback(done)
            if stopping:
                log(f"received signal {stop.signal or 'on another rank'} after step {done}: checkpoint written, exiting "
                    f"with status {PREEMPTED_EXIT} so that the job is retried and resumes")
                sys.exit(PREEMPTED_EXIT)
    _write_ledger(ledger_path, rows)
    if cfg.save_moments and rank == 0:
        from growlm.growth.moments import save_moments

        save_moments(cfg.save_moments, model, optimizer)
    final = rows[-1]
    from growlm.devices import mfu

    achieved = steps_timed * tokens_per_step * flops_per_token / step_s if step_s > 0 else None
    if gpu_settings:  # model FLOPs per second of training steps over the device's bf16 peak
        gpu_settings["mfu"] = mfu(achieved or 0.0, gpu_settings["peak_flops"])
    return {"steps": cfg.steps, "tokens": cfg.steps * tokens_per_step,
            "flops": cfg.steps * tokens_per_step * flops_per_token, "wall_s": wall(),
            "final_val_loss": final["val_loss"], "flops_per_token": flops_per_token,
            "model_flops_per_s": achieved, "gpu_settings": gpu_settings, "config": asdict(cfg)}
