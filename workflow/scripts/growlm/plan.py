"""The memory planner: how to train a model of a given size on the devices at hand.

`make_plan` picks, for a model, a context length, a global batch and some devices (count and memory
each, from `torch.cuda` or a `memory_limit_gb` cap), the fastest setting whose estimated peak memory
fits: the micro-batch size and the gradient-accumulation steps (the global batch, hence the result,
never changes), activation checkpointing (none, every k-th block, all), the precision (bf16
autocast on a CUDA device with bf16, else fp32) and, with a process group or several devices, the
strategy (DDP, FSDP2 `fully_shard`, FSDP2 with `CPUOffloadPolicy`). Settings are tried in this
order and the first that fits wins:

    for strategy in (single | DDP), FSDP2, FSDP2 + CPU offload:     # FSDP2 only with >1 device,
        for checkpointing in none, every 4th block, every 2nd, all:  # offload also on one device
            the largest micro-batch (a divisor of the per-device batch) that fits

so checkpointing and offload appear only when nothing cheaper fits. `next_smaller` walks the same
ladder one rung down (a smaller micro-batch, then more checkpointing, then sharding/offload) for
recovery from an out-of-memory error; `train_with_replanning` does that recovery around
`growlm.train.train`. `write_plan`/`read_plan` store a plan as JSON (`plan.json`); `apply_plan`
turns it into a `TrainConfig`.

The analytic estimate (`estimate_memory`, bytes per device)
------------------------------------------------------------
P parameters (a tied LM head counts once), width d, heads h, MLP width f (= 4d), vocabulary V,
context T, n = micro_batch * T tokens per micro-batch, L blocks of which C are checkpointed;
s_a = bytes of an activation (4 in fp32, 2 under bf16 autocast), s_r = 4 (the residual stream and
LayerNorm outputs stay fp32 under autocast because the weights are fp32).

  static (single, DDP)  = 4P params + 4P grads + 8P AdamW (exp_avg, exp_avg_sq in fp32) = 16 P
                          (gradients are counted whole: with accumulation they live through the
                          next micro-batch's forward; DDP uses gradient_as_bucket_view, no copy)
  static (FSDP2)        = 16 P / N + 2 * 4 P_root + 3 * 4 P_block
                          (root = embeddings + ln_f, unsharded for the whole step, plus its grads;
                          about three blocks unsharded at once: current, prefetched, grads)
  static (FSDP2+offload)= 2 * 4 P_root + 3 * 4 P_block      (the 16 P / N shards live in host RAM)
  + under bf16 autocast   2 * P_mm: the bf16 copies of the matmul weights (P_mm = L (4d^2 + 2df) + Vd)
                          that autocast caches in the forward and the matmuls keep for the backward

  saved activations of one block, per token (HF GPT2Block with SDPA, dropout 0):
      a_block = s_r d  (block input, kept by ln_1)  + s_a d (ln_1 out, kept by c_attn)
              + 3 s_a d (q, k, v = c_attn out, kept by SDPA) + s_a d (SDPA out) + 4 h (logsumexp)
              + s_r d  (attn + residual, kept by ln_2)  + s_a d (ln_2 out, kept by c_fc)
              + s_a f  (c_fc out, kept by GELU)  + s_a f (GELU out, kept by mlp.c_proj)
              + 16     (mean and rstd of two LayerNorms)
            = (2 s_r + 6 s_a) d + 2 s_a f + 4 h + 16
            =  68 d + 4 h + 16 bytes in fp32 (f = 4d),  40 d + 4 h + 16 under bf16 autocast
  a checkpointed block keeps only its input:   a_ckpt = s_r d
  head (ln_f input and output):                a_head = s_r d + s_a d + 8
  logits and loss at their peak (start of the backward: log-softmax output, its gradient and the
  gradient of the logits, fp32 because the loss upcasts):   a_logits = 12 V (fp32), 10 V (bf16;
  measured on an H100)
  transient at the backward of a block:  a_trans = 2 s_a f + s_r d; with checkpointing the block
  being recomputed adds a_block.

  a_trans = 2 s_a f + s_r d (a block's backward: MLP gradients and the incoming gradient)
  saved(n)       = n * [ (L - C) a_block + C a_ckpt + a_head ]
  activations(n) = max( saved(n) + n a_logits,                                 (start of the backward)
                        max_i n * [ sum_{j<i} kept_j + kept_i + a_trans + [i checkpointed] a_block ] )
                   (in the backward of block i the later blocks are freed; a checkpointed block
                   is recomputed whole; checkpointed blocks are 0, k, 2k, ...)
  peak           = static + activations(n) + workspace (64 MiB on CUDA, for cuBLAS/SDPA workspaces)

  On the CPU (fp32, one process) the training loop computes head + loss in chunks
  (`growlm.train._FusedHeadCrossEntropy`, chunk = max(64, 2^20 / V) rows): there a_logits = 0, the
  head keeps ln_f's input and 8 d per token (ln_f output and its gradient), and the dynamic term is
  max(4Vd + 4V min(n, chunk) (2 if n > chunk), 8Vd + 8dn, n a_trans) bytes.
  Without gradient accumulation (micro-batch = the whole per-device batch, one process) the
  gradients do not exist during the forward: only 4 (P_root + P_block) of them count at the peak.

On the CPU (fp32) this is within 2% of the measured peak in the accumulation steady state
(bench/memory.py; up to 7% high without accumulation, up to 15% high with checkpointing on tiny
models); on an H100 (bf16) the activation slope was within about 3% (high) and the intercept 5-9%
low before the autocast copies were added; the pre-run below corrects what is left.

and a plan must satisfy peak <= safety (0.9) * usable, where usable is the device's total memory
less a fixed CUDA context allowance (512 MiB), or the `memory_limit_gb` cap if smaller. On the CPU
the cap applies to this estimate directly. Evaluation (no grad, micro-batch sized) needs less.

The measured correction
-----------------------
With `measure=True` (the default on CUDA) the planner builds the model once on the device and runs
forward+backward at two micro-batch sizes with gradients and optimizer states allocated (the
gradient-accumulation steady state), measuring the peak: `torch.cuda.max_memory_allocated` on a GPU;
on the CPU the allocator's own allocation/free events from `torch.profiler` (`profile_memory=True`)
summed in time order (tracemalloc does not see torch's allocator, RSS is blurred by malloc caching).
A straight line a + b * micro_batch is fitted; the estimate of every candidate is then shifted by
(a_measured - a_estimated) and its activation slope scaled by b_measured / b_estimated, and the plan
is chosen again (at most twice). Then the next larger micro-batch, if its corrected estimate is
within 15% of the budget, is measured directly and taken if its measured peak fits (the line is
slightly concave on GPUs, so extrapolating from small sizes is conservative). Measuring needs the whole model on one device, so FSDP plans of
models too large for one device keep the analytic estimate (`plan.source` says which was used).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from growlm.errors import GrowlmError

GiB = 2**30
MiB = 2**20
CUDA_CONTEXT_BYTES = 512 * MiB  # CUDA context + cuDNN/cuBLAS handles, outside the caching allocator
CUDA_WORKSPACE_BYTES = 64 * MiB  # cuBLAS / SDPA workspaces inside the allocator
SAFETY = 0.9  # estimates must fit in 90% of what is usable (allocator fragmentation, noise)
STRATEGIES = ("single", "ddp", "fsdp", "fsdp_offload")
PLAN_VERSION = 1


# --- model shape ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a GPT-2."""

    n_embd: int
    n_layer: int
    vocab_size: int
    n_head: int
    n_positions: int = 1024
    n_inner: int | None = None
    tie_word_embeddings: bool = True

    @classmethod
    def of(cls, model) -> "ModelShape":
        """From a ModelShape, a GPT2Config, a model (its `.config`), or a dict with the same keys
        (`d`, `L`, `V`, `heads` are accepted as short names)."""
        if isinstance(model, ModelShape):
            return model
        if isinstance(model, torch.nn.Module):
            model = getattr(getattr(model, "module", model), "config")
        if isinstance(model, dict):
            m = dict(model)
            for short, long in (("d", "n_embd"), ("L", "n_layer"), ("V", "vocab_size"), ("heads", "n_head")):
                if short in m:
                    m[long] = m.pop(short)
            if "n_head" not in m:
                m["n_head"] = max(1, m["n_embd"] // m.pop("head_dim", 64))
            m.pop("head_dim", None)
            keys = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in m.items() if k in keys})
        return cls(n_embd=model.n_embd, n_layer=model.n_layer, vocab_size=model.vocab_size, n_head=model.n_head,
                   n_positions=model.n_positions, n_inner=getattr(model, "n_inner", None),
                   tie_word_embeddings=bool(getattr(model, "tie_word_embeddings", True)))

    @property
    def f(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @property
    def block_params(self) -> int:
        d, f = self.n_embd, self.f
        return 4 * d * d + 2 * d * f + 9 * d + f  # ln_1, c_attn, c_proj, ln_2, c_fc, mlp c_proj

    @property
    def root_params(self) -> int:
        d = self.n_embd
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.n_positions * d + 2 * d + head

    @property
    def n_params(self) -> int:
        return self.n_layer * self.block_params + self.root_params

    def gpt2_config(self):
        from growlm.model import gpt2_config

        return gpt2_config(n_embd=self.n_embd, n_layer=self.n_layer, vocab_size=self.vocab_size,
                           n_positions=self.n_positions, n_head=self.n_head,
                           tie_word_embeddings=self.tie_word_embeddings)


# --- the plan ---------------------------------------------------------------------------------

@dataclass
class Plan:
    """One training setting and why; JSON-serialisable (`write_plan`, `read_plan`)."""

    global_batch: int  # sequences per optimizer step, all devices together (never changed)
    context: int
    n_devices: int
    micro_batch_size: int  # sequences per forward/backward on one device
    grad_accum_steps: int  # micro-batches per device per optimizer step
    checkpointing: str  # "none" | "every_k" | "all"
    checkpoint_every: int  # 0: none; k: blocks 0, k, 2k, ... recompute their activations; 1: all
    precision: str  # "bf16-autocast" | "fp32"
    strategy: str  # "single" | "ddp" | "fsdp" | "fsdp_offload"
    device_type: str  # "cuda" | "cpu"
    budget_bytes: int  # usable bytes per device the plan was made to fit (after the safety factor)
    estimated_peak_bytes: int  # estimate of the chosen setting (measured correction applied if any)
    estimate: dict = field(default_factory=dict)  # breakdown of the chosen setting, bytes
    model: dict = field(default_factory=dict)  # ModelShape fields and n_params
    source: str = "analytic"  # "analytic" | "measured" (analytic corrected by the pre-run)
    measured: dict | None = None  # pre-run: micro_batches, peak_bytes, fitted a, b, the estimate's a, b
    history: list = field(default_factory=list)  # earlier settings replaced after an out-of-memory error
    version: int = PLAN_VERSION

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.n_devices

    @property
    def shape(self) -> ModelShape:
        keys = {f.name for f in dataclasses.fields(ModelShape)}
        return ModelShape(**{k: v for k, v in self.model.items() if k in keys})

    def describe(self) -> str:
        ck = {"none": "no checkpointing", "all": "checkpointing every block"}.get(
            self.checkpointing, f"checkpointing every {self.checkpoint_every}th block")
        return (f"{self.strategy} on {self.n_devices} {self.device_type} device(s), micro-batch "
                f"{self.micro_batch_size} x {self.grad_accum_steps} accumulation steps "
                f"(global batch {self.global_batch}), {ck}, {self.precision}; estimated peak "
                f"{self.estimated_peak_bytes / GiB:.2f} GiB of {self.budget_bytes / GiB:.2f} GiB")


def write_plan(plan: Plan, path: str | Path) -> Path:
    """Write `plan` as JSON (atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(plan), indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def read_plan(path: str | Path) -> Plan:
    path = Path(path)
    if not path.is_file():
        raise GrowlmError(f"no plan at {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise GrowlmError(f"plan {path} is not valid JSON: {err}") from err
    keys = {f.name for f in dataclasses.fields(Plan)}
    unknown = set(data) - keys
    if unknown:
        raise GrowlmError(f"plan {path} has unknown fields {sorted(unknown)}")
    return Plan(**data)


def apply_plan(train_config, plan: Plan):
    """A copy of `train_config` (a TrainConfig) set up as the plan says: micro-batch size and
    activation checkpointing (`extra['checkpoint_every']` = k for every k-th block). The global batch
    must be the plan's."""
    if train_config.batch_size != plan.global_batch:
        raise GrowlmError(f"the plan was made for a global batch of {plan.global_batch}, the training "
                          f"config has {train_config.batch_size}")
    if train_config.context != plan.context:
        raise GrowlmError(f"the plan was made for context {plan.context}, the training config has "
                          f"{train_config.context}")
    extra = {k: v for k, v in train_config.extra.items() if k not in ("checkpoint_every", "strategy")}
    if plan.checkpoint_every:
        extra["checkpoint_every"] = plan.checkpoint_every
    extra["strategy"] = plan.strategy
    return dataclasses.replace(train_config, micro_batch_size=plan.micro_batch_size,
                               gradient_checkpointing=plan.checkpoint_every > 0, extra=extra)


def enable_checkpointing(model: torch.nn.Module, every: int = 1) -> None:
    """Activation checkpointing (non-reentrant) on blocks 0, k, 2k, ... (k = `every`; 1: all, 0: none).

    HF GPT-2 blocks are `GradientCheckpointingLayer`s with a `gradient_checkpointing` flag each;
    enabling it on the model sets them all, after which the blocks not chosen are switched off."""
    core = getattr(model, "module", model)
    if every <= 0:
        return
    kwargs = {"use_reentrant": False}
    if hasattr(core, "activation_checkpointing_enable"):
        core.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        core.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    blocks = getattr(getattr(core, "transformer", None), "h", None)
    if blocks is not None and every > 1:
        for i, block in enumerate(blocks):
            if hasattr(block, "gradient_checkpointing"):
                block.gradient_checkpointing = i % every == 0


# --- the estimate -----------------------------------------------------------------------------

def checkpoint_levels(n_layer: int) -> list[int]:
    """`checkpoint_every` values from least to most recomputation, without duplicates in effect."""
    out, seen = [], set()
    for k in (0, 4, 2, 1):
        count = 0 if k == 0 else math.ceil(n_layer / k)
        if count not in seen:
            seen.add(count)
            out.append(k)
    return out


def n_checkpointed(n_layer: int, every: int) -> int:
    return 0 if every <= 0 else math.ceil(n_layer / every)


def estimate_memory(model, *, micro_batch: int, context: int, precision: str = "fp32",
                    checkpoint_every: int = 0, strategy: str = "single", n_devices: int = 1,
                    device_type: str = "cpu", fused_head: bool | None = None,
                    accumulate: bool = True) -> dict:
    """Peak bytes per device of one training step, broken down (see the module docstring).
    `fused_head`: the training loop's chunked head + loss (`growlm.train._FusedHeadCrossEntropy`),
    which it uses for a plain model in fp32 on the CPU (the default here then). `accumulate`: False
    when the micro-batch is the whole per-device batch: then (single device, no DDP buckets) the
    gradients do not exist during the forward and grow while the activations are freed, and only
    the embeddings' and one block's gradients count at the peak."""
    s = ModelShape.of(model)
    d, h, f, V, L = s.n_embd, s.n_head, s.f, s.vocab_size, s.n_layer
    P = s.n_params
    s_a = 2 if precision.startswith("bf16") else 4
    s_r = 4
    if strategy in ("single", "ddp"):
        params, grads, optim = 4 * P, 4 * P, 8 * P
        if strategy == "single" and not accumulate:
            grads = 4 * (s.root_params + s.block_params)
        gathered = 0
    elif strategy == "fsdp":
        params, grads, optim = 4 * P / n_devices, 4 * P / n_devices, 8 * P / n_devices
        gathered = 2 * 4 * s.root_params + 3 * 4 * s.block_params
    elif strategy == "fsdp_offload":
        params = grads = optim = 0
        gathered = 2 * 4 * s.root_params + 3 * 4 * s.block_params
    else:
        raise GrowlmError(f"unknown strategy {strategy!r}; one of {STRATEGIES}")
    C = n_checkpointed(L, checkpoint_every)
    a_block = (2 * s_r + 6 * s_a) * d + 2 * s_a * f + 4 * h + 16
    a_ckpt = s_r * d
    a_logits = (10 if s_a == 2 else 12) * V
    a_trans = 2 * s_a * f + s_r * d  # MLP gradients and the incoming gradient, in a block's backward
    n = micro_batch * context
    kept = [a_ckpt if checkpoint_every > 0 and i % checkpoint_every == 0 else a_block for i in range(L)]
    saved = n * (sum(kept) + s_r * d + 8)  # + ln_f's input and statistics
    if fused_head is None:
        fused_head = device_type == "cpu" and s_a == 4 and strategy == "single"
    if fused_head:  # chunked head + loss: no logits; ln_f output and its gradient, the head's gradient
        chunk = max(64, (1 << 20) // V)
        head_fwd = 4 * V * d + 4 * V * min(n, chunk) * (2 if n > chunk else 1) + 8 * d * n
        head_bwd = 8 * V * d + 8 * d * n
        dynamic = max(head_fwd, head_bwd)
    else:
        saved += n * s_a * d  # ln_f output, kept by lm_head
        dynamic = n * a_logits
    # in the backward of block i the blocks after it are freed; a checkpointed block is recomputed whole
    below = 0
    for i in range(L):
        extra = a_block if kept[i] == a_ckpt and a_ckpt != a_block else 0
        dynamic = max(dynamic, n * (below + kept[i] + extra + a_trans) - saved)
        below += kept[i]
    activations = saved + dynamic
    per_token = activations / n
    workspace = CUDA_WORKSPACE_BYTES if device_type == "cuda" else 0
    p_mm = L * (4 * d * d + 2 * d * f) + V * d
    autocast_copies = 2 * p_mm if s_a == 2 else 0
    static = params + grads + optim + gathered + autocast_copies
    return {"params": int(params), "grads": int(grads), "optimizer": int(optim), "gathered": int(gathered),
            "autocast_copies": int(autocast_copies), "fused_head": bool(fused_head),
            "activations": int(activations), "workspace": workspace,
            "activation_bytes_per_token": int(per_token), "static": int(static + workspace),
            "total": int(static + workspace + activations)}


# --- devices ----------------------------------------------------------------------------------

def device_budget(device_type: str, memory_limit_gb: float | None) -> tuple[int, int]:
    """(usable bytes per device, of which the safety factor keeps `SAFETY`), as (raw, budget)."""
    if device_type == "cuda":
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        usable = total - CUDA_CONTEXT_BYTES
        if memory_limit_gb is not None:
            usable = min(usable, int(memory_limit_gb * GiB))
    else:
        if memory_limit_gb is None:
            usable = _host_memory_bytes()
        else:
            usable = int(memory_limit_gb * GiB)
    return usable, int(usable * SAFETY)


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * GiB


def _divisors_desc(n: int) -> list[int]:
    return [k for k in range(n, 0, -1) if n % k == 0]


def _strategies(n_devices: int, device_type: str, allow_offload: bool) -> list[str]:
    if n_devices > 1:
        out = ["ddp", "fsdp"]
    else:
        out = ["single"]
    if allow_offload and device_type == "cuda":
        out.append("fsdp_offload")
    return out


@dataclass
class _Correction:
    a: float = 0.0  # added to every estimate
    b_scale: float = 1.0  # multiplies the activation slope

    def apply(self, est: dict) -> int:
        return int(est["static"] + self.a + self.b_scale * est["activations"])


def _ladder(shape: ModelShape, n_devices: int, device_type: str, allow_offload: bool):
    """(strategy, checkpoint_every) tiers in order of preference."""
    for strategy in _strategies(n_devices, device_type, allow_offload):
        for k in checkpoint_levels(shape.n_layer):
            yield strategy, k


def _fits_host(shape: ModelShape, strategy: str, n_devices: int) -> bool:
    if strategy != "fsdp_offload":
        return True
    return 16 * shape.n_params * 1.2 < _host_memory_bytes()


def _choose(shape, *, context, global_batch, n_devices, device_type, precision, budget, correction,
            allow_offload) -> tuple[str, int, int, dict] | None:
    local = global_batch // n_devices
    for strategy, k in _ladder(shape, n_devices, device_type, allow_offload):
        if not _fits_host(shape, strategy, n_devices):
            continue
        for mb in _divisors_desc(local):
            est = estimate_memory(shape, micro_batch=mb, context=context, precision=precision, checkpoint_every=k,
                                  strategy=strategy, n_devices=n_devices, device_type=device_type,
                                  accumulate=mb < local)
            if correction.apply(est) <= budget:
                return strategy, k, mb, est
    return None


def _make(shape, *, context, global_batch, n_devices, device_type, precision, usable, budget, choice,
          correction, source, measured) -> Plan:
    strategy, k, mb, est = choice
    total = correction.apply(est)
    est = {**est, "total_corrected": total, "usable_bytes": usable}
    ck = "none" if k == 0 else ("all" if n_checkpointed(shape.n_layer, k) == shape.n_layer else "every_k")
    return Plan(global_batch=global_batch, context=context, n_devices=n_devices, micro_batch_size=mb,
                grad_accum_steps=global_batch // n_devices // mb, checkpointing=ck,
                checkpoint_every=0 if k == 0 else (1 if ck == "all" else k), precision=precision,
                strategy=strategy, device_type=device_type, budget_bytes=budget, estimated_peak_bytes=total,
                estimate=est, model={**asdict(shape), "n_params": shape.n_params}, source=source,
                measured=measured)


def make_plan(model, *, context: int, global_batch: int, n_devices: int | None = None,
              memory_limit_gb: float | None = None, device: str | None = None, measure: bool | None = None,
              allow_offload: bool = True, log=None) -> Plan:
    """The fastest setting that fits (module docstring). `model`: GPT2Config, model, ModelShape or
    dict; `n_devices`: processes/GPUs (default: the torch.distributed world size, else 1);
    `memory_limit_gb`: a cap per device (on the CPU it applies to the analytic estimate); `measure`:
    correct the estimate by a short pre-run on the device (default: on CUDA)."""
    shape = ModelShape.of(model)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = torch.device(device).type
    if n_devices is None:
        import torch.distributed as dist

        n_devices = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if global_batch % n_devices:
        raise GrowlmError(f"global batch {global_batch} is not divisible by {n_devices} devices")
    precision = "bf16-autocast" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    usable, budget = device_budget(device_type, memory_limit_gb)
    if measure is None:
        measure = device_type == "cuda"
    kw = dict(context=context, global_batch=global_batch, n_devices=n_devices, device_type=device_type,
              precision=precision, allow_offload=allow_offload)
    correction, source, measured = _Correction(), "analytic", None
    choice = _choose(shape, budget=budget, correction=correction, **kw)
    if choice is None:
        raise GrowlmError(_no_fit_message(shape, budget, **kw))
    if measure:
        for _ in range(2):
            strategy, k, mb, est = choice
            if strategy not in ("single", "ddp"):
                break  # the pre-run needs the whole model on one device
            result = _measured_correction(shape, context=context, micro_batch=mb, local_batch=global_batch // n_devices,
                                          checkpoint_every=k, precision=precision, device=device, n_devices=n_devices,
                                          strategy=strategy)
            if result is None:
                break
            correction, measured = result
            source = "measured"
            new = _choose(shape, budget=budget, correction=correction, **kw)
            if new is None:
                raise GrowlmError(_no_fit_message(shape, budget, **kw) + " (after the measured correction)")
            same = new[:3] == choice[:3]
            choice = new
            if same:
                break
    verified = None
    if source == "measured":
        choice, verified = _try_larger(shape, choice, correction, budget=budget, device=device, **kw)
        if verified:
            measured = {**measured, "verified": verified}
    plan = _make(shape, usable=usable, budget=budget, choice=choice, correction=correction, source=source,
                 measured=measured, **{k: v for k, v in kw.items() if k != "allow_offload"})
    for v in verified or []:
        if v["fits"] and v["micro_batch"] == plan.micro_batch_size:
            plan.estimated_peak_bytes = int(v["peak_bytes"])  # measured at this very setting
    if log is not None:
        log(f"memory plan: {plan.describe()}")
    return plan


def _try_larger(shape, choice, correction, *, budget, device, context, global_batch, n_devices, device_type,
                precision, allow_offload):
    """Measure the next larger micro-batches of the chosen tier directly while their corrected
    estimate is within 15% of the budget; take each whose measured peak fits."""
    strategy, k, mb, est = choice
    verified = []
    if strategy not in ("single", "ddp"):
        return choice, verified
    for up in sorted(m for m in _divisors_desc(global_batch // n_devices) if m > mb):
        local = global_batch // n_devices
        up_est = estimate_memory(shape, micro_batch=up, context=context, precision=precision, checkpoint_every=k,
                                 strategy=strategy, n_devices=n_devices, device_type=device_type,
                                 accumulate=up < local)
        if correction.apply(up_est) > 1.15 * budget:
            break
        line = measure_line(shape, context=context, micro_batches=(up,), device=device, checkpoint_every=k,
                            precision=precision, local_batch=local if strategy == "single" else None)
        peak = line["peak_bytes"][0] if line["peak_bytes"] else None
        verified.append({"micro_batch": up, "peak_bytes": peak, "fits": peak is not None and peak <= budget})
        if not verified[-1]["fits"]:
            break
        choice = (strategy, k, up, up_est)
    return choice, verified


def _no_fit_message(shape, budget, *, context, global_batch, n_devices, device_type, precision, allow_offload):
    smallest = estimate_memory(shape, micro_batch=1, context=context, precision=precision, checkpoint_every=1,
                               strategy="fsdp_offload" if allow_offload and device_type == "cuda" else
                               ("fsdp" if n_devices > 1 else "single"),
                               n_devices=n_devices, device_type=device_type)
    return (f"a model of {shape.n_params:,} parameters (d={shape.n_embd}, L={shape.n_layer}) does not fit: "
            f"even micro-batch 1 with every block checkpointed needs an estimated "
            f"{smallest['total'] / GiB:.3f} GiB per device; the budget is {budget / GiB:.3f} GiB ({SAFETY:.0%} of "
            f"what is usable). Use more or "
            f"larger devices, a shorter context or a smaller model")


# --- the measured pre-run ---------------------------------------------------------------------

def _live_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def measure_peak_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batch: int, context: int,
                       *, device: str, precision: str = "fp32", grads: bool = True) -> int:
    """Peak bytes allocated on `device` by one forward+backward of `micro_batch` sequences, counting
    what is already allocated (parameters, gradients, optimizer states).

    CUDA: `torch.cuda.max_memory_allocated`. CPU: the CPU allocator's allocation and free events
    recorded by `torch.profiler(profile_memory=True)`, summed in time order, on top of the bytes of the
    model's and optimizer's tensors. `grads=False`: gradients are dropped first (no accumulation)."""
    from growlm.train import lm_loss

    if not grads:
        model.zero_grad(set_to_none=True)

    vocab = getattr(getattr(model, "module", model), "config").vocab_size
    gen = torch.Generator().manual_seed(micro_batch)
    x = torch.randint(0, vocab, (micro_batch, context), generator=gen).to(device)
    y = torch.randint(0, vocab, (micro_batch, context), generator=gen).to(device)
    use_bf16 = precision.startswith("bf16")

    def fwd_bwd():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            loss = lm_loss(model, x, y, logits=False)[0]  # as the training loop calls it
        loss.backward()
        return loss.item()

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    from torch.profiler import ProfilerActivity, profile

    base = _live_bytes([*model.parameters(), *(p.grad for p in model.parameters()), *model.buffers(),
                        *(v for st in optimizer.state.values() for v in st.values()), x, y])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fwd_bwd()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    cpu = torch._C._autograd.DeviceType.CPU
    current = peak = 0
    for e in events:
        if e.device_type() == cpu:
            current += e.nbytes()
            peak = max(peak, current)
    return int(base + peak)


def measure_line(model_config, *, context: int, micro_batches: tuple[int, ...], device: str = "cpu",
                 checkpoint_every: int = 0, precision: str | None = None, seed: int = 0,
                 local_batch: int | None = None) -> dict:
    """Build the model on `device`, put it in the accumulation steady state (one step taken, so AdamW
    states exist, and gradients present) and measure the peak at each micro-batch size; fit a + b*mb.
    A size that runs out of CUDA memory is left out (`oom` lists it). A size equal to `local_batch` (one
    micro-batch per step, one process) is measured without gradients present, as training runs it."""
    from transformers import GPT2LMHeadModel

    from growlm.train import TrainConfig, lm_loss, make_optimizer

    shape = ModelShape.of(model_config)
    config = model_config if hasattr(model_config, "to_dict") else shape.gpt2_config()
    if precision is None:
        precision = "bf16-autocast" if device.startswith("cuda") and torch.cuda.is_bf16_supported() else "fp32"
    peaks, sizes, oom = [], [], []
    model = optimizer = None
    try:
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            model = GPT2LMHeadModel(config)
        model.train()
        enable_checkpointing(model, checkpoint_every)
        optimizer = make_optimizer(model, TrainConfig(tokens=context, batch_size=1, context=context, device=device))
        vocab = config.vocab_size
        x = torch.randint(0, vocab, (1, context), device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision.startswith("bf16")):
            loss = lm_loss(model, x, x, logits=False)[0]
        loss.backward()
        del loss
        optimizer.step()  # AdamW states exist; gradients are kept (the accumulation steady state)
        for mb in micro_batches:
            try:
                peaks.append(measure_peak_bytes(model, optimizer, mb, context, device=device, precision=precision,
                                                grads=mb != local_batch))
                sizes.append(mb)
            except torch.cuda.OutOfMemoryError:
                oom.append(mb)
                _free(device)
    finally:
        del model, optimizer
        _free(device)
    out = {"micro_batches": sizes, "peak_bytes": peaks, "oom": oom, "checkpoint_every": checkpoint_every,
           "precision": precision}
    if len(sizes) >= 2:
        b = (peaks[-1] - peaks[0]) / (sizes[-1] - sizes[0])
        out.update(a=peaks[0] - b * sizes[0], b=b)
    return out


def _free(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _measured_correction(shape, *, context, micro_batch, local_batch, checkpoint_every, precision, device,
                         n_devices, strategy) -> tuple[_Correction, dict] | None:
    device_type = torch.device(device).type
    hi = micro_batch if micro_batch > 1 else min(2, local_batch)
    lo = max(1, hi // 2)
    if lo == hi:
        return None
    line = measure_line(shape, context=context, micro_batches=(lo, hi), device=device,
                        checkpoint_every=checkpoint_every, precision=precision)
    est = {mb: estimate_memory(shape, micro_batch=mb, context=context, precision=precision,
                               checkpoint_every=checkpoint_every, strategy="single", n_devices=1,
                               device_type=device_type) for mb in (lo, hi)}
    b_est = (est[hi]["total"] - est[lo]["total"]) / (hi - lo)
    a_est = est[lo]["total"] - b_est * lo
    line.update(a_est=a_est, b_est=b_est)
    if "b" in line:
        b_scale = line["b"] / b_est
        a = line["a"] - a_est
    elif line["micro_batches"]:  # one size measured: keep the analytic slope, correct the intercept
        b_scale = 1.0
        a = line["peak_bytes"][0] - est[line["micro_batches"][0]]["total"]
    else:  # even the smaller size ran out of memory: make the estimate say so
        b_scale, a = 1.0, float("inf")
    if line["oom"] and math.isfinite(a):
        # a size the line says fits did not: push the line above the budget for that size
        a = max(a, 0.0) + 0.1 * est[hi]["total"]
    line["a_correction"], line["b_scale"] = a, b_scale
    return _Correction(a=a if math.isfinite(a) else 1e30, b_scale=b_scale), line


# --- recovery from out-of-memory errors -------------------------------------------------------

def _estimate_of(plan: Plan, strategy: str, k: int, mb: int) -> int:
    est = estimate_memory(plan.shape, micro_batch=mb, context=plan.context, precision=plan.precision,
                          checkpoint_every=k, strategy=strategy, n_devices=plan.n_devices,
                          device_type=plan.device_type, accumulate=mb < plan.local_batch)
    m = plan.measured or {}
    return _Correction(a=m.get("a_correction", 0.0) if math.isfinite(m.get("a_correction", 0.0)) else 0.0,
                       b_scale=m.get("b_scale", 1.0)).apply(est)


def next_smaller(plan: Plan, *, allow_offload: bool = True) -> Plan | None:
    """The next rung down the ladder, for recovery from an out-of-memory error, or None at the bottom:
    a smaller micro-batch (the next divisor of the per-device batch); at micro-batch 1, the next
    checkpointing level (every 4th, every 2nd, every block) and then FSDP2 sharding (with several
    devices) and FSDP2 with CPU offload, each with the largest micro-batch whose estimate is below
    the estimate of the setting that ran out of memory. The global batch never changes."""
    shape = plan.shape
    local = plan.local_batch
    current_k = plan.checkpoint_every
    current = _estimate_of(plan, plan.strategy, current_k, plan.micro_batch_size)
    smaller = [mb for mb in _divisors_desc(local) if mb < plan.micro_batch_size]

    def build(strategy, k, mb):
        ck = "none" if k == 0 else ("all" if n_checkpointed(shape.n_layer, k) == shape.n_layer else "every_k")
        new = dataclasses.replace(
            plan, strategy=strategy, checkpoint_every=0 if k == 0 else (1 if ck == "all" else k), checkpointing=ck,
            micro_batch_size=mb, grad_accum_steps=local // mb, estimated_peak_bytes=_estimate_of(plan, strategy, k, mb),
            estimate=estimate_memory(shape, micro_batch=mb, context=plan.context, precision=plan.precision,
                                     checkpoint_every=k, strategy=strategy, n_devices=plan.n_devices,
                                     device_type=plan.device_type, accumulate=mb < local),
            history=[*plan.history, {"strategy": plan.strategy, "micro_batch_size": plan.micro_batch_size,
                                     "checkpoint_every": plan.checkpoint_every}])
        return new

    if smaller:
        return build(plan.strategy, current_k, smaller[0])
    tiers = list(_ladder(shape, plan.n_devices, plan.device_type, allow_offload))
    if plan.strategy == "single" and plan.n_devices == 1 and allow_offload:
        tiers = [t for t in tiers if t[0] in ("single", "fsdp_offload")]
    try:
        pos = tiers.index((plan.strategy, current_k))
    except ValueError:
        pos = -1
    for strategy, k in tiers[pos + 1:]:
        if not _fits_host(shape, strategy, plan.n_devices):
            continue
        for mb in _divisors_desc(local):
            if _estimate_of(plan, strategy, k, mb) < current:
                return build(strategy, k, mb)
    return None


def train_with_replanning(build_model: Callable[[], torch.nn.Module], train_tokens, val_tokens, cfg, plan: Plan, *,
                          ckpt_dir, ledger_path, plan_path=None, log=print, step_callback=None,
                          allow_offload: bool = True) -> dict:
    """`growlm.train.train` under `plan`; on a CUDA out-of-memory error, step down to `next_smaller(plan)`,
    write it to `plan_path` (if given), log it and resume from the last checkpoint in `ckpt_dir` (or
    from the start if there is none yet). Raises GrowlmError when the smallest plan runs out of memory.

    `build_model()` returns a fresh, unwrapped model with the initial weights; it is wrapped for the
    plan's strategy (`growlm.distributed.wrap_model`) on every attempt, so that a switch to FSDP2 with
    offload works. Returns train()'s summary with the final plan under "plan".

    Within one process only: under torchrun, `growlm.distributed.main` writes the smaller plan and
    exits non-zero, so that the retried job (Snakemake `retries`) resumes with it."""
    from growlm.distributed import wrap_model
    from growlm.train import train

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
