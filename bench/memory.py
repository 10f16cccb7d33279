"""Benchmark of the memory planner (growlm.memory).

GPU (`--gpu`): under a memory cap (`torch.cuda.set_per_process_memory_fraction`, default 8 GiB),
walk a ladder of GPT-2 sizes (d, L; head size 64; context 1024; global batch 16; vocabulary 4096,
the workflow's) and find
  * the largest model that trains naively (whole batch in one pass, no checkpointing, no offload),
  * the largest model that trains with the planner's setting (make_plan with the same cap),
  * at the largest naive-feasible size, the planner's throughput relative to naive.
Goals: >= 4x the parameters, >= 70% of the throughput. "Trains" means `growlm.train.train` runs
its steps (two optimizer steps plus the evaluations) without a CUDA out-of-memory error.

    PYTHONPATH=workflow/scripts python bench/memory.py --gpu --out memory_gpu.csv

CPU (default): the analytic estimate against the measured peak (the CPU allocator's events from
torch.profiler, cross-checked against the resident-set high-water mark) for a few sizes, in the
gradient-accumulation steady state that the estimate describes; prints each ratio and, last,
`estimate_error_max=<x>` (goal: <= 0.15).

    PYTHONPATH=workflow/scripts python bench/memory.py --out memory_cpu.csv
"""

from __future__ import annotations

import argparse
import csv
import gc
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from growlm.memory.estimate import GiB, apply_plan, estimate_memory  # noqa: E402
from growlm.memory.measure import make_plan, measure_peak_bytes  # noqa: E402
from growlm.shape import ModelShape  # noqa: E402

LADDER = [(256, 4), (384, 6), (512, 8), (640, 10), (768, 12), (896, 14), (1024, 16), (1280, 18), (1536, 20),
          (1792, 24), (2048, 24), (2304, 28), (2560, 32)]


def log(msg: str) -> None:
    print(msg, flush=True)


# --- CPU: estimate vs measured ------------------------------------------------------------------

def _rss_hwm_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _mmap_large_allocations() -> None:
    """Make glibc serve allocations >= 64 KiB with mmap and give them back on free, so that the
    resident set follows the live tensors (for the RSS cross-check)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (also stops the dynamic threshold)
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    except OSError:
        pass


def cpu_bench(out: Path | None) -> float:
    from transformers import GPT2LMHeadModel

    from growlm.loss import lm_loss
    from growlm.families import family_of
    from growlm.model import enable_recompute
    from growlm.train import make_optimizer
    from growlm.train_config import TrainConfig

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    _mmap_large_allocations()
    cases = [  # d, L, V, T, micro-batch, recompute_every
        (128, 4, 4096, 128, 8, 0),
        (256, 4, 4096, 256, 4, 0),
        (256, 6, 4096, 256, 8, 2),
        (384, 6, 4096, 256, 4, 0),
        (512, 8, 4096, 256, 4, 1),
        (512, 8, 8192, 512, 4, 0),
    ]
    rows, worst = [], 0.0
    for d, L, V, T, mb, k in cases:
        shape = ModelShape(n_embd=d, n_layer=L, vocab_size=V, n_head=d // 64, n_positions=T)
        model = GPT2LMHeadModel(family_of(shape).config(shape))
        model.train()
        enable_recompute(model, k)
        opt = make_optimizer(model, TrainConfig(tokens=T, batch_size=1, context=T, lr=1e-3, warmup_steps=0))
        x = torch.randint(0, V, (1, T))
        lm_loss(model, x, x)[0].backward()
        opt.step()  # AdamW states exist, gradients stay: the accumulation steady state
        measure_peak_bytes(model, opt, mb, T, device="cpu")  # warm-up (first-call allocations)
        t0 = time.perf_counter()
        measured = measure_peak_bytes(model, opt, mb, T, device="cpu")
        secs = time.perf_counter() - t0
        # cross-check: resident-set high-water mark over the same forward+backward, without the profiler
        rss_delta = float("nan")
        if _rss_hwm_reset():
            gc.collect()
            before = _status_kb("VmRSS")
            _rss_hwm_reset()
            with torch.autocast("cuda", enabled=False):
                lm_loss(model, torch.randint(0, V, (mb, T)), torch.randint(0, V, (mb, T)),
                        logits=False)[0].backward()
            rss_delta = (_status_kb("VmHWM") - before) * 1024
        est = estimate_memory(shape, micro_batch=mb, context=T, recompute_every=k)
        static = est["static"]
        ratio = est["total"] / measured
        worst = max(worst, abs(ratio - 1))
        row = {"d": d, "L": L, "V": V, "context": T, "micro_batch": mb, "recompute_every": k,
               "n_params": shape.n_params, "estimate_mib": round(est["total"] / 2**20, 2),
               "measured_mib": round(measured / 2**20, 2), "ratio": round(ratio, 4),
               "activations_estimate_mib": round(est["activations"] / 2**20, 2),
               "activations_measured_mib": round((measured - static) / 2**20, 2),
               "rss_activations_mib": round(rss_delta / 2**20, 2) if math.isfinite(rss_delta) else "",
               "measure_s": round(secs, 2)}
        rows.append(row)
        log(f"d={d:4d} L={L:2d} V={V} T={T} mb={mb} recompute_every={k}: estimate {row['estimate_mib']:9.2f} MiB, "
            f"measured {row['measured_mib']:9.2f} MiB, ratio {ratio:.4f} (activations: estimate "
            f"{row['activations_estimate_mib']:.1f}, profiler {row['activations_measured_mib']:.1f}, "
            f"RSS high-water {row['rss_activations_mib']} MiB)")
        del model, opt
        gc.collect()
    if out:
        _write_csv(out, rows)
    return worst


# --- GPU: largest trainable model, throughput ------------------------------------------------------

_CAP_BYTES = 8 * GiB


def _tokens(n: int = 1 << 21, vocab: int = 4096) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab, n).astype(np.uint16)


def _cleanup() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _trial(shape: ModelShape, plan, *, batch: int, context: int, steps: int, data: np.ndarray) -> dict:
    """Train `steps` optimizer steps naively (plan None) or with the plan; return fits, peak, tokens/s."""
    from transformers import GPT2LMHeadModel

    from growlm.distributed import wrap_model
    from growlm.families import family_of
    from growlm.train import train
    from growlm.train_config import TrainConfig

    cfg = TrainConfig(tokens=steps * batch * context, batch_size=batch, context=context, lr=1e-4, warmup_steps=1,
                      eval_interval=10**9, eval_tokens=context, checkpoint_every=10**9, dense_log_steps=0, device="cuda")
    if plan is not None:
        cfg = apply_plan(cfg, plan)
    times: list[float] = []
    result = {"fits": 0, "peak_gib": "", "reserved_gib": "", "tokens_per_s": "", "error": ""}
    model = None
    _cleanup()
    torch.cuda.reset_peak_memory_stats()
    try:
        build_on = "cuda" if 4 * shape.n_params < 0.6 * _CAP_BYTES else "cpu"  # fast init on the GPU
        with torch.device(build_on):
            model = GPT2LMHeadModel(family_of(shape).config(shape))
        model = wrap_model(model, plan, device="cuda")
        with tempfile.TemporaryDirectory() as tmp:
            train(model, data, data[: 4 * context], cfg, ckpt_dir=Path(tmp) / "ck", ledger_path=Path(tmp) / "l.csv",
                  log=lambda s: None, step_callback=lambda s: times.append(time.perf_counter()))
        torch.cuda.synchronize()
        result["fits"] = 1
        if len(times) >= 3:
            k = len(times) - 2  # steps after the first two (warm-up); the last step includes an evaluation
            result["tokens_per_s"] = round(k * batch * context / (times[-2] - times[1]), 1) if k > 1 else ""
    except torch.cuda.OutOfMemoryError as err:
        result["error"] = "OOM: " + str(err).splitlines()[0][:120]
    except Exception as err:  # a failure that is not a memory one is reported, not hidden
        result["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    finally:
        result["peak_gib"] = round(torch.cuda.max_memory_allocated() / GiB, 3)
        result["reserved_gib"] = round(torch.cuda.max_memory_reserved() / GiB, 3)
        del model
        _cleanup()
    return result


def gpu_bench(out: Path | None, *, cap_gb: float, batch: int, context: int, vocab: int, time_budget: float,
              max_params: float) -> tuple[float, float]:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap_gb * GiB / total)
    global _CAP_BYTES
    _CAP_BYTES = int(cap_gb * GiB)
    data = _tokens(vocab=vocab)
    t_start = time.perf_counter()
    rows = []

    def shape_of(d, L):
        return ModelShape(n_embd=d, n_layer=L, vocab_size=vocab, n_head=d // 64, n_positions=context)

    def record(mode, d, L, plan, res, extra=None):
        s = shape_of(d, L)
        row = {"mode": mode, "d": d, "L": L, "n_params": s.n_params, "cap_gib": cap_gb, "batch": batch,
               "context": context, "strategy": plan.strategy if plan else "single",
               "micro_batch": plan.micro_batch_size if plan else batch,
               "recompute_every": plan.recompute_every if plan else 0,
               "estimate_gib": round((plan.estimated_peak_bytes if plan else estimate_memory(
                   s, micro_batch=batch, context=context, precision="bf16-autocast", device_type="cuda")["total"])
                   / GiB, 3),
               "plan_source": plan.source if plan else "", **res, **(extra or {})}
        rows.append(row)
        log(" ".join(f"{k}={v}" for k, v in row.items()))
        if out:
            _write_csv(out, rows)
        return row

    # 1. naive: the whole batch in one pass, no checkpointing, no offload
    naive_max = None
    for d, L in LADDER:
        res = _trial(shape_of(d, L), None, batch=batch, context=context, steps=2, data=data)
        record("naive", d, L, None, res)
        if not res["fits"]:
            break
        naive_max = (d, L)
    # 2. planner: from the naive maximum up, as long as time allows
    plan_max = None
    start = LADDER.index(naive_max) if naive_max else 0
    for d, L in LADDER[start:]:
        s = shape_of(d, L)
        if s.n_params > max_params or time.perf_counter() - t_start > time_budget:
            log(f"stopping the planner ladder before d={d} L={L} ({s.n_params / 1e6:.0f}M parameters): "
                f"{'parameter limit' if s.n_params > max_params else 'time budget'}")
            break
        t0 = time.perf_counter()
        try:
            plan = make_plan(s, context=context, global_batch=batch, memory_limit_gb=cap_gb, device="cuda")
        except Exception as err:
            record("planner", d, L, None, {"fits": 0, "error": f"no plan: {err}"[:200]})
            break
        plan_s = time.perf_counter() - t0
        res = _trial(s, plan, batch=batch, context=context, steps=2, data=data)
        record("planner", d, L, plan, res, {"plan_s": round(plan_s, 1)})
        if not res["fits"]:
            break
        plan_max = (d, L)
    # 3. throughput at the largest naive-feasible size: naive vs the planner's setting
    thr_ratio = float("nan")
    if naive_max:
        s = shape_of(*naive_max)
        plan = make_plan(s, context=context, global_batch=batch, memory_limit_gb=cap_gb, device="cuda")
        naive = _trial(s, None, batch=batch, context=context, steps=8, data=data)
        planned = _trial(s, plan, batch=batch, context=context, steps=8, data=data)
        record("throughput-naive", *naive_max, None, naive)
        record("throughput-planner", *naive_max, plan, planned)
        if naive["tokens_per_s"] and planned["tokens_per_s"]:
            thr_ratio = planned["tokens_per_s"] / naive["tokens_per_s"]
    p_naive = shape_of(*naive_max).n_params if naive_max else 0
    p_plan = shape_of(*plan_max).n_params if plan_max else 0
    ratio = p_plan / p_naive if p_naive else float("nan")
    log(f"largest naive: {naive_max} ({p_naive / 1e6:.1f}M parameters); largest with the planner: {plan_max} "
        f"({p_plan / 1e6:.1f}M); cap {cap_gb} GiB, batch {batch}x{context}, vocab {vocab}; "
        f"{time.perf_counter() - t_start:.0f}s")
    log(f"params_ratio={ratio:.2f} throughput_ratio={thr_ratio:.3f}")
    return ratio, thr_ratio


def _write_csv(path: Path, rows: list[dict]) -> None:
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="the GPU benchmark (needs CUDA)")
    p.add_argument("--out", type=Path, help="CSV of the rows")
    p.add_argument("--cap-gb", type=float, default=8.0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--time-budget", type=float, default=300.0, help="seconds before the planner ladder stops")
    p.add_argument("--max-params", type=float, default=1.3e9, help="largest model the planner ladder tries")
    args = p.parse_args(argv)
    if args.gpu:
        if not torch.cuda.is_available():
            print("--gpu needs CUDA", file=sys.stderr)
            return 2
        gpu_bench(args.out, cap_gb=args.cap_gb, batch=args.batch, context=args.context, vocab=args.vocab,
                  time_budget=args.time_budget, max_params=args.max_params)
        return 0
    worst = cpu_bench(args.out)
    print(f"estimate_error_max={worst:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
