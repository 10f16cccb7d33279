"""The measured correction of the memory estimate, and `make_plan`, which puts the two together.

With `measure=True` (the default on CUDA) the planner builds the model once on the device and runs
forward+backward at two micro-batch sizes with gradients and optimizer states allocated (the
gradient-accumulation steady state), measuring the peak: `torch.cuda.max_memory_allocated` on a GPU;
on the CPU the allocator's own allocation/free events from `torch.profiler` (`profile_memory=True`)
summed in time order (tracemalloc does not see torch's allocator, RSS is blurred by malloc caching).
A straight line a + b * micro_batch is fitted; the estimate of every candidate is then shifted by
(a_measured - a_estimated) and its activation slope scaled by b_measured / b_estimated, and the plan
is chosen again (at most twice). Then the next larger micro-batch, if its corrected estimate is
within 15% of the budget, is measured directly and taken if its measured peak fits (the line is
slightly concave on GPUs, so extrapolating from small sizes is conservative). Measuring needs the
whole model on one device, so FSDP plans of models too large for one device keep the analytic
estimate (`plan.source` says which was used).
"""

from __future__ import annotations

import gc
import math

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from growlm.errors import GrowlmError
from growlm.families import FAMILY, family_of
from growlm.loss import lm_loss
from growlm.memory.estimate import (Correction, Plan, choose_setting, device_budget, divisors_desc,
                                    estimate_memory, no_fit_message, plan_from)
from growlm.model import enable_recompute
from growlm.shape import ModelShape
from growlm.train import make_optimizer
from growlm.train_config import TrainConfig


def make_plan(model, *, context: int, global_batch: int, n_devices: int | None = None,
              memory_limit_gb: float | None = None, device: str | None = None, measure: bool | None = None,
              allow_offload: bool = True, gpu_share: float = 1.0, log=None) -> Plan:
    """The fastest setting that fits (`growlm.memory.estimate`), corrected by a measured pre-run.

    `model`: GPT2Config, model, ModelShape or dict; `n_devices`: processes/GPUs (default: the torch.distributed world size, else 1);
    `memory_limit_gb`: a cap per device (on the CPU it applies to the analytic estimate); `gpu_share`:
    the share of each GPU's memory this job may use (1/k when k jobs share a GPU; `device_budget`);
    `measure`: correct the estimate by a short pre-run on the device (default: on CUDA)."""
    shape = ModelShape.of(model)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = torch.device(device).type
    if n_devices is None:
        n_devices = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if global_batch % n_devices:
        raise GrowlmError(f"global batch {global_batch} is not divisible by {n_devices} devices")
    precision = "bf16-autocast" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    usable, budget = device_budget(device_type, memory_limit_gb, gpu_share)
    if measure is None:
        measure = device_type == "cuda"
    kw = dict(context=context, global_batch=global_batch, n_devices=n_devices, device_type=device_type,
              precision=precision, allow_offload=allow_offload)
    correction, source, measured = Correction(), "analytic", None
    choice = choose_setting(shape, budget=budget, correction=correction, **kw)
    if choice is None:
        raise GrowlmError(no_fit_message(shape, budget, **kw))
    if measure:
        for _ in range(2):
            strategy, k, mb, est = choice
            if strategy not in ("single", "ddp"):
                break  # the pre-run needs the whole model on one device
            result = _measured_correction(shape, context=context, micro_batch=mb, local_batch=global_batch // n_devices,
                                          recompute_every=k, precision=precision, device=device, n_devices=n_devices,
                                          strategy=strategy)
            if result is None:
                break
            correction, measured = result
            source = "measured"
            new = choose_setting(shape, budget=budget, correction=correction, **kw)
            if new is None:
                raise GrowlmError(no_fit_message(shape, budget, **kw) + " (after the measured correction)")
            same = new[:3] == choice[:3]
            choice = new
            if same:
                break
    verified = None
    if source == "measured":
        choice, verified = _try_larger(shape, choice, correction, budget=budget, device=device, **kw)
        if verified:
            measured = {**measured, "verified": verified}
    plan = plan_from(shape, usable=usable, budget=budget, choice=choice, correction=correction, source=source,
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
    for up in sorted(m for m in divisors_desc(global_batch // n_devices) if m > mb):
        local = global_batch // n_devices
        up_est = estimate_memory(shape, micro_batch=up, context=context, precision=precision, recompute_every=k,
                                 strategy=strategy, n_devices=n_devices, device_type=device_type,
                                 accumulate=up < local)
        if correction.apply(up_est) > 1.15 * budget:
            break
        line = measure_line(shape, context=context, micro_batches=(up,), device=device, recompute_every=k,
                            precision=precision, local_batch=local if strategy == "single" else None)
        peak = line["peak_bytes"][0] if line["peak_bytes"] else None
        verified.append({"micro_batch": up, "peak_bytes": peak, "fits": peak is not None and peak <= budget})
        if not verified[-1]["fits"]:
            break
        choice = (strategy, k, up, up_est)
    return choice, verified


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
                 recompute_every: int = 0, precision: str | None = None, seed: int = 0,
                 local_batch: int | None = None) -> dict:
    """Build the model on `device`, put it in the accumulation steady state (one step taken, so AdamW
    states exist, and gradients present) and measure the peak at each micro-batch size; fit a + b*mb.
    A size that runs out of CUDA memory is left out (`oom` lists it). A size equal to `local_batch` (one
    micro-batch per step, one process) is measured without gradients present, as training runs it."""
    shape = ModelShape.of(model_config)
    if hasattr(model_config, "to_dict"):
        config = model_config
    else:
        config = FAMILY[shape.family].config(shape)
    if precision is None:
        precision = "bf16-autocast" if device.startswith("cuda") and torch.cuda.is_bf16_supported() else "fp32"
    peaks, sizes, oom = [], [], []
    model = optimizer = None
    try:
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            model = family_of(config).model_class(config)
        model.train()
        enable_recompute(model, recompute_every)
        optimizer = make_optimizer(model, TrainConfig(tokens=context, batch_size=1, context=context, lr=1e-3,
                                                      warmup_steps=0, device=device))
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
    out = {"micro_batches": sizes, "peak_bytes": peaks, "oom": oom, "recompute_every": recompute_every,
           "precision": precision}
    if len(sizes) >= 2:
        b = (peaks[-1] - peaks[0]) / (sizes[-1] - sizes[0])
        out.update(a=peaks[0] - b * sizes[0], b=b)
    return out


def _free(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _measured_correction(shape, *, context, micro_batch, local_batch, recompute_every, precision, device,
                         n_devices, strategy) -> tuple[Correction, dict] | None:
    device_type = torch.device(device).type
    hi = micro_batch if micro_batch > 1 else min(2, local_batch)
    lo = max(1, hi // 2)
    if lo == hi:
        return None
    line = measure_line(shape, context=context, micro_batches=(lo, hi), device=device,
                        recompute_every=recompute_every, precision=precision)
    est = {mb: estimate_memory(shape, micro_batch=mb, context=context, precision=precision,
                               recompute_every=recompute_every, strategy="single", n_devices=1,
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
    return Correction(a=a if math.isfinite(a) else 1e30, b_scale=b_scale), line


