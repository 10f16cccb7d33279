"""The analytic memory estimate and the plan it chooses.

A `Plan` is one way to train a model of a given shape with a global batch on some devices: the
micro-batch size and gradient-accumulation steps (the global batch, hence the result, never
changes), activation recomputation (none, every k-th block, all), the precision (bf16 autocast on
a CUDA device with bf16, else fp32) and, with several devices, the strategy (DDP, FSDP2
`fully_shard`, FSDP2 with `CPUOffloadPolicy`). `choose_setting` takes the first setting of this
ladder whose estimated peak fits the budget:

    for strategy in (single | DDP), FSDP2, FSDP2 + CPU offload:     # FSDP2 only with >1 device,
        for recomputation in none, every 4th block, every 2nd, all:  # offload also on one device
            the largest micro-batch (a divisor of the per-device batch) that fits

so recomputation and offload appear only when nothing cheaper fits. `next_smaller` walks the same
ladder one rung down (a smaller micro-batch, then more recomputation, then sharding/offload) for
recovery from an out-of-memory error. `write_plan`/`read_plan` store a plan as JSON (`plan.json`);
`apply_plan` sets a `TrainConfig`'s micro-batch, recomputation and strategy from it.
(`growlm.memory.measure.make_plan` corrects the estimate by a measured pre-run first.)

The analytic estimate (`estimate_memory`, bytes per device)
------------------------------------------------------------
P parameters (a tied LM head counts once), width d, heads h, MLP width f (= 4d), vocabulary V,
context T, n = micro_batch * T tokens per micro-batch, L blocks of which C recompute their
activations; s_a = bytes of an activation (4 in fp32, 2 under bf16 autocast), s_r = 4 (the residual
stream and LayerNorm outputs stay fp32 under autocast because the weights are fp32).

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
  a recomputing block keeps only its input:    a_ckpt = s_r d
  head (ln_f input and output):                a_head = s_r d + s_a d + 8
  logits and loss at their peak (start of the backward: log-softmax output, its gradient and the
  gradient of the logits, fp32 because the loss upcasts):   a_logits = 12 V (fp32), 10 V (bf16;
  measured on an H100)
  transient at the backward of a block:  a_trans = 2 s_a f + s_r d (MLP gradients and the incoming
  gradient); a block being recomputed adds a_block.

  saved(n)       = n * [ (L - C) a_block + C a_ckpt + a_head ]
  activations(n) = max( saved(n) + n a_logits,                                 (start of the backward)
                        max_i n * [ sum_{j<i} kept_j + kept_i + a_trans + [i recomputed] a_block ] )
                   (in the backward of block i the later blocks are freed; a recomputing block
                   is recomputed whole; recomputing blocks are 0, k, 2k, ...)
  peak           = static + activations(n) + workspace (64 MiB on CUDA, for cuBLAS/SDPA workspaces)

  Each family's block has its own terms (`growlm.family_specs.FamilySpec.activations`: GPT-2's above,
  `gpt2_activations`). The Llama block (`llama_activations`, transformers' LlamaDecoderLayer with SDPA; grouped-
  query attention runs inside SDPA, so the key/value heads are not repeated; g dh key/value channels):
      a_block = 2 (2 s_r d + 4)   (two RMSNorms, eager in fp32: input, normalised value, 1/rms)
              + s_a (2 d + 2 g dh)  (norm output kept by q/k/v; q, k after rotary and v kept by SDPA)
              + s_a d + 4 h + s_a d  (SDPA output, logsumexp; second norm's output)
              + 4 s_a f              (gate out, SiLU out, up out, their product)
      a_trans = 3 s_a f + s_r d;  the final norm keeps 2 s_r d + 4.

  On the CPU (fp32, one process) the training loop computes head + loss in chunks
  (`growlm.loss.FusedHeadCrossEntropy`, chunk = max(64, 2^20 / V) rows): there a_logits = 0, the
  head keeps ln_f's input and 8 d per token (ln_f output and its gradient), and the dynamic term is
  max(4Vd + 4V min(n, chunk) (2 if n > chunk), 8Vd + 8dn, n a_trans) bytes.
  Without gradient accumulation (micro-batch = the whole per-device batch, one process) the
  gradients do not exist during the forward: only 4 (P_root + P_block) of them count at the peak.

On the CPU (fp32) this is within 2% of the measured peak in the accumulation steady state
(bench/memory.py; up to 7% high without accumulation, up to 15% high with recomputation on tiny
models); on an H100 (bf16) the activation slope was within about 3% (high) and the intercept 5-9%
low before the autocast copies were added; the measured pre-run corrects what is left.

A plan must satisfy peak <= safety (0.9) * usable, where usable is the job's share of the device's
total memory (`gpu_share`, 1 unless several jobs share a GPU) less a fixed CUDA context allowance
(512 MiB), or the `memory_limit_gb` cap if smaller. On the CPU the cap applies to this estimate
directly. Evaluation (no grad, micro-batch sized) needs less.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from growlm.atomic import write_json_atomic
from growlm.errors import GrowlmError
from growlm.shape import ModelShape
from growlm.train_config import STRATEGIES, TrainConfig

GiB = 2**30
MiB = 2**20
CUDA_CONTEXT_BYTES = 512 * MiB  # CUDA context + cuDNN/cuBLAS handles, outside the caching allocator
CUDA_WORKSPACE_BYTES = 64 * MiB  # cuBLAS / SDPA workspaces inside the allocator
SAFETY = 0.9  # estimates must fit in 90% of what is usable (allocator fragmentation, noise)
PLAN_VERSION = 2  # 2: activation recomputation named `recompute` / `recompute_every`


# --- the plan ---------------------------------------------------------------------------------

@dataclass
class Plan:
    """One training setting and why; JSON-serialisable (`write_plan`, `read_plan`)."""

    global_batch: int  # sequences per optimizer step, all devices together (never changed)
    context: int
    n_devices: int
    micro_batch_size: int  # sequences per forward/backward on one device
    grad_accum_steps: int  # micro-batches per device per optimizer step
    recompute: str  # "none" | "every_k" | "all"
    recompute_every: int  # 0: none; k: blocks 0, k, 2k, ... recompute their activations; 1: all
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
    made_for: dict = field(default_factory=dict)  # the job settings it was made for (growlm.runner.plan_settings)
    version: int = PLAN_VERSION

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.n_devices

    @property
    def shape(self) -> ModelShape:
        keys = {f.name for f in dataclasses.fields(ModelShape)}
        return ModelShape(**{k: v for k, v in self.model.items() if k in keys})

    def describe(self) -> str:
        ck = {"none": "no recomputation", "all": "recomputing every block"}.get(
            self.recompute, f"recomputing every {self.recompute_every}th block")
        return (f"{self.strategy} on {self.n_devices} {self.device_type} device(s), micro-batch "
                f"{self.micro_batch_size} x {self.grad_accum_steps} accumulation steps "
                f"(global batch {self.global_batch}), {ck}, {self.precision}; estimated peak "
                f"{self.estimated_peak_bytes / GiB:.2f} GiB of {self.budget_bytes / GiB:.2f} GiB")


def write_plan(plan: Plan, path: str | Path) -> Path:
    """Write `plan` as JSON (atomically)."""
    return write_json_atomic(path, asdict(plan), indent=2, sort_keys=True)


def read_plan(path: str | Path) -> Plan:
    path = Path(path)
    if not path.is_file():
        raise GrowlmError(f"no plan at {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise GrowlmError(f"plan {path} is not valid JSON: {err}") from err
    if data.get("version") != PLAN_VERSION:
        raise GrowlmError(f"plan {path} is of version {data.get('version')}, this growlm writes {PLAN_VERSION}")
    keys = {f.name for f in dataclasses.fields(Plan)}
    unknown = set(data) - keys
    if unknown:
        raise GrowlmError(f"plan {path} has unknown fields {sorted(unknown)}")
    return Plan(**data)


def apply_plan(train_config: TrainConfig, plan: Plan) -> TrainConfig:
    """A copy of `train_config` set up as the plan says: micro-batch size, activation recomputation
    (every k-th block) and strategy. The global batch and the context must be the plan's."""
    if train_config.batch_size != plan.global_batch:
        raise GrowlmError(f"the plan was made for a global batch of {plan.global_batch}, the training "
                          f"config has {train_config.batch_size}")
    if train_config.context != plan.context:
        raise GrowlmError(f"the plan was made for context {plan.context}, the training config has "
                          f"{train_config.context}")
    return train_config.with_(micro_batch_size=plan.micro_batch_size, recompute_every=plan.recompute_every,
                              strategy=plan.strategy)


# --- the estimate -----------------------------------------------------------------------------

def recompute_levels(n_layer: int) -> list[int]:
    """`recompute_every` values from least to most recomputation, without duplicates in effect."""
    out, seen = [], set()
    for k in (0, 4, 2, 1):
        count = 0 if k == 0 else math.ceil(n_layer / k)
        if count not in seen:
            seen.add(count)
            out.append(k)
    return out


def n_recomputed(n_layer: int, every: int) -> int:
    return 0 if every <= 0 else math.ceil(n_layer / every)


def estimate_memory(model, *, micro_batch: int, context: int, precision: str = "fp32",
                    recompute_every: int = 0, strategy: str = "single", n_devices: int = 1,
                    device_type: str = "cpu", fused_head: bool | None = None,
                    accumulate: bool = True) -> dict:
    """Peak bytes per device of one training step, broken down (see the module docstring).
    `fused_head`: the training loop's chunked head + loss (`growlm.loss.FusedHeadCrossEntropy`),
    which it uses for a plain model in fp32 on the CPU (the default here then). `accumulate`: False
    when the micro-batch is the whole per-device batch: then (single device, no DDP buckets) the
    gradients do not exist during the forward and grow while the activations are freed, and only
    the embeddings' and one block's gradients count at the peak."""
    s = ModelShape.of(model)
    d, V, L = s.n_embd, s.vocab_size, s.n_layer
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
    a_block, a_trans, a_final = s.spec.activations(s, s_a, s_r)  # the family's block (growlm.family_specs)
    a_ckpt = s_r * d
    a_logits = (10 if s_a == 2 else 12) * V
    n = micro_batch * context
    kept = [a_ckpt if recompute_every > 0 and i % recompute_every == 0 else a_block for i in range(L)]
    saved = n * (sum(kept) + a_final)
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
    # in the backward of block i the blocks after it are freed; a recomputing block is recomputed whole
    below = 0
    for i in range(L):
        extra = a_block if kept[i] == a_ckpt and a_ckpt != a_block else 0
        dynamic = max(dynamic, n * (below + kept[i] + extra + a_trans) - saved)
        below += kept[i]
    activations = saved + dynamic
    per_token = activations / n
    workspace = CUDA_WORKSPACE_BYTES if device_type == "cuda" else 0
    p_mm = L * (s.attention_params + s.mlp_params) + V * d
    autocast_copies = 2 * p_mm if s_a == 2 else 0
    static = params + grads + optim + gathered + autocast_copies
    return {"params": int(params), "grads": int(grads), "optimizer": int(optim), "gathered": int(gathered),
            "autocast_copies": int(autocast_copies), "fused_head": bool(fused_head),
            "activations": int(activations), "workspace": workspace,
            "activation_bytes_per_token": int(per_token), "static": int(static + workspace),
            "total": int(static + workspace + activations)}


# --- devices ----------------------------------------------------------------------------------

def device_budget(device_type: str, memory_limit_gb: float | None, gpu_share: float = 1.0) -> tuple[int, int]:
    """(usable bytes per device, of which the safety factor keeps `SAFETY`), as (raw, budget).

    On a GPU shared by several jobs (`gpu_share` = 1/k for k jobs), a job may use only its share:
    share x the device's memory, less its own CUDA context (every process has one), and never more
    than `memory_limit_gb`. The share is not applied on the CPU, where `memory_limit_gb` (or the
    host's memory) is the budget."""
    if not 0 < gpu_share <= 1:
        raise GrowlmError(f"gpu_share must be in (0, 1], got {gpu_share}")
    if device_type == "cuda":
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        usable = int(total * gpu_share) - CUDA_CONTEXT_BYTES
        if usable <= 0:
            raise GrowlmError(f"a share of {gpu_share} of this GPU ({total / GiB:.1f} GiB) leaves nothing beside the "
                              f"CUDA context ({CUDA_CONTEXT_BYTES / GiB:.1f} GiB); let fewer jobs share it")
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


def divisors_desc(n: int) -> list[int]:
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
class Correction:
    a: float = 0.0  # added to every estimate
    b_scale: float = 1.0  # multiplies the activation slope

    def apply(self, est: dict) -> int:
        return int(est["static"] + self.a + self.b_scale * est["activations"])


def ladder(shape: ModelShape, n_devices: int, device_type: str, allow_offload: bool):
    """(strategy, recompute_every) tiers in order of preference."""
    for strategy in _strategies(n_devices, device_type, allow_offload):
        for k in recompute_levels(shape.n_layer):
            yield strategy, k


def _fits_host(shape: ModelShape, strategy: str, n_devices: int) -> bool:
    if strategy != "fsdp_offload":
        return True
    return 16 * shape.n_params * 1.2 < _host_memory_bytes()


def choose_setting(shape, *, context, global_batch, n_devices, device_type, precision, budget, correction,
            allow_offload) -> tuple[str, int, int, dict] | None:
    local = global_batch // n_devices
    for strategy, k in ladder(shape, n_devices, device_type, allow_offload):
        if not _fits_host(shape, strategy, n_devices):
            continue
        for mb in divisors_desc(local):
            est = estimate_memory(shape, micro_batch=mb, context=context, precision=precision, recompute_every=k,
                                  strategy=strategy, n_devices=n_devices, device_type=device_type,
                                  accumulate=mb < local)
            if correction.apply(est) <= budget:
                return strategy, k, mb, est
    return None


def plan_from(shape, *, context, global_batch, n_devices, device_type, precision, usable, budget, choice,
          correction, source, measured) -> Plan:
    strategy, k, mb, est = choice
    total = correction.apply(est)
    est = {**est, "total_corrected": total, "usable_bytes": usable}
    ck = "none" if k == 0 else ("all" if n_recomputed(shape.n_layer, k) == shape.n_layer else "every_k")
    return Plan(global_batch=global_batch, context=context, n_devices=n_devices, micro_batch_size=mb,
                grad_accum_steps=global_batch // n_devices // mb, recompute=ck,
                recompute_every=0 if k == 0 else (1 if ck == "all" else k), precision=precision,
                strategy=strategy, device_type=device_type, budget_bytes=budget, estimated_peak_bytes=total,
                estimate=est, model={**asdict(shape), "n_params": shape.n_params}, source=source,
                measured=measured)


def no_fit_message(shape, budget, *, context, global_batch, n_devices, device_type, precision, allow_offload):
    smallest = estimate_memory(shape, micro_batch=1, context=context, precision=precision, recompute_every=1,
                               strategy="fsdp_offload" if allow_offload and device_type == "cuda" else
                               ("fsdp" if n_devices > 1 else "single"),
                               n_devices=n_devices, device_type=device_type)
    return (f"a model of {shape.n_params:,} parameters (d={shape.n_embd}, L={shape.n_layer}) does not fit: "
            f"even micro-batch 1 with every block recomputed needs an estimated "
            f"{smallest['total'] / GiB:.3f} GiB per device; the budget is {budget / GiB:.3f} GiB ({SAFETY:.0%} of "
            f"what is usable). Use more or "
            f"larger devices, a shorter context or a smaller model")


# --- recovery from out-of-memory errors -------------------------------------------------------

def plan_estimate(plan: Plan, strategy: str, k: int, mb: int) -> int:
    est = estimate_memory(plan.shape, micro_batch=mb, context=plan.context, precision=plan.precision,
                          recompute_every=k, strategy=strategy, n_devices=plan.n_devices,
                          device_type=plan.device_type, accumulate=mb < plan.local_batch)
    m = plan.measured or {}
    return Correction(a=m.get("a_correction", 0.0) if math.isfinite(m.get("a_correction", 0.0)) else 0.0,
                       b_scale=m.get("b_scale", 1.0)).apply(est)


def next_smaller(plan: Plan, *, allow_offload: bool = True) -> Plan | None:
    """The next rung down the ladder, for recovery from an out-of-memory error, or None at the bottom:
    a smaller micro-batch (the next divisor of the per-device batch); at micro-batch 1, the next
    recomputation level (every 4th, every 2nd, every block) and then FSDP2 sharding (with several
    devices) and FSDP2 with CPU offload, each with the largest micro-batch whose estimate is below
    the estimate of the setting that ran out of memory. The global batch never changes."""
    shape = plan.shape
    local = plan.local_batch
    current_k = plan.recompute_every
    current = plan_estimate(plan, plan.strategy, current_k, plan.micro_batch_size)
    smaller = [mb for mb in divisors_desc(local) if mb < plan.micro_batch_size]

    def build(strategy, k, mb):
        ck = "none" if k == 0 else ("all" if n_recomputed(shape.n_layer, k) == shape.n_layer else "every_k")
        new = dataclasses.replace(
            plan, strategy=strategy, recompute_every=0 if k == 0 else (1 if ck == "all" else k), recompute=ck,
            micro_batch_size=mb, grad_accum_steps=local // mb, estimated_peak_bytes=plan_estimate(plan, strategy, k, mb),
            estimate=estimate_memory(shape, micro_batch=mb, context=plan.context, precision=plan.precision,
                                     recompute_every=k, strategy=strategy, n_devices=plan.n_devices,
                                     device_type=plan.device_type, accumulate=mb < local),
            history=[*plan.history, {"strategy": plan.strategy, "micro_batch_size": plan.micro_batch_size,
                                     "recompute_every": plan.recompute_every}])
        return new

    if smaller:
        return build(plan.strategy, current_k, smaller[0])
    tiers = list(ladder(shape, plan.n_devices, plan.device_type, allow_offload))
    if plan.strategy == "single" and plan.n_devices == 1 and allow_offload:
        tiers = [t for t in tiers if t[0] in ("single", "fsdp_offload")]
    try:
        pos = tiers.index((plan.strategy, current_k))
    except ValueError:
        pos = -1
    for strategy, k in tiers[pos + 1:]:
        if not _fits_host(shape, strategy, plan.n_devices):
            continue
        for mb in divisors_desc(local):
            if plan_estimate(plan, strategy, k, mb) < current:
                return build(strategy, k, mb)
    return None


