"""MFU of growlm's training step on a GPU, and the bf16 matmul ceiling for the same GEMM shapes.

For each width d (12 layers, context 1024 by default) this runs `growlm.train.train` itself (bf16
autocast, fused AdamW, TF32, pinned batches, losses read every `--sync-every` steps; `--compile
[MODE]` adds torch.compile, "reduce-overhead" its CUDA graphs), times `--steps` steps after
`--warm` untimed ones from its `step_callback` (synchronising the device at the two stamps), then
the nanoGPT-style reference loop (`bench/reference_loop.py`: the same GPT-2 and step, compiled in
the same mode) the same way in the same process, and reports

- tokens/s and the model FLOP/s, `tokens/s * growlm.flops.model_train_flops_per_token` (the
  formula the ledger uses: 6 N_mm + 12 L T d per token),
- MFU: that over the device's dense bf16 peak (`growlm.devices`, or `--peak-flops`),
- train()'s own MFU figure (its summary's `gpu_settings['mfu']`, over all its steps but the first),
- the reference loop's tokens/s and MFU, and the ratio growlm / reference,
- the matmul ceiling: the FLOP/s that torch.matmul reaches in bf16 on the model's own GEMMs (per
  layer: tokens x d x 3d, x d x d, x d x 4d, x 4d x d, and the head tokens x d x V; each forward,
  input-gradient and weight-gradient product, weighted as one training step runs them), as a
  fraction of the peak. Attention (SDPA) is not in it.

It prints a table and writes a CSV (`--out`). Run from the repository root:

    PYTHONPATH=workflow/scripts python bench/gpu.py --out results.csv [--compile [MODE]]
    for m in default reduce-overhead max-autotune; do    # choose train.compile's mode by measurement
        PYTHONPATH=workflow/scripts python bench/gpu.py --sizes 768,1024 --compile $m --out mfu_$m.csv; done
    PYTHONPATH=workflow/scripts python bench/gpu.py --cpu-smoke     # tiny, on the CPU: MFU n/a

Imports only torch, growlm (and so transformers) and bench/reference_loop.py.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from growlm.devices import device_name, mfu, peak_flops
from growlm.flops import model_train_flops_per_token
from growlm.model import build_model, n_params
from growlm.train import train
from growlm.train_config import COMPILE_MODES, TrainConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_loop import RefGPT, RefTrainer  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def train_rate(model, data, *, batch: int, context: int, warm: int, steps: int, device: str,
               compile: str | bool, sync_every: int, peak: float | None) -> tuple[float, dict]:
    """tokens/s of growlm.train.train over `steps` steps after `warm`; and train()'s summary."""
    stamps: dict[int, float] = {}

    def on_step(done: int) -> None:
        if done in (warm, warm + steps):
            _sync(device)
            stamps[done] = time.perf_counter()

    total = warm + steps + 1  # the last step is followed by the final evaluation: not timed
    cfg = TrainConfig(tokens=total * batch * context, batch_size=batch, context=context, lr=3e-4,
                      warmup_steps=10, eval_interval=10**9, eval_tokens=context, final_eval_tokens=context,
                      checkpoint_every=10**9, dense_log_steps=0,
                      device=device, compile=compile, sync_every=sync_every, peak_flops=peak)
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(model, data, data, cfg, ckpt_dir=Path(tmp) / "ck", ledger_path=Path(tmp) / "l.csv",
                        log=lambda s: None, step_callback=on_step)
    return steps * batch * context / (stamps[warm + steps] - stamps[warm]), summary


def reference_rate(ref: RefGPT, data, *, batch: int, context: int, warm: int, steps: int, device: str,
                   compile: str | bool) -> float:
    """tokens/s of the reference loop over `steps` steps after `warm` (it reads the loss every 10
    steps, as nanoGPT's log interval does)."""
    trainer = RefTrainer(ref, data, batch_size=batch, context=context, device=device, lr=3e-4, warmup_steps=10,
                         total_steps=warm + steps)
    if compile:
        trainer.model = torch.compile(trainer.model, mode="default" if compile is True else compile)
    for _ in range(warm):
        trainer.step()
    _sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        trainer.step(sync=(i % 10 == 9))
    _sync(device)
    return steps * batch * context / (time.perf_counter() - t0)


def _time_matmul(a: torch.Tensor, b: torch.Tensor, reps: int, device: str) -> float:
    """Seconds per a @ b (median-free: the mean of `reps` after 3 warm-ups)."""
    for _ in range(3):
        torch.matmul(a, b)
    _sync(device)
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            torch.matmul(a, b)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.matmul(a, b)
    return (time.perf_counter() - t0) / reps


def gemm_ceiling(*, tokens: int, d: int, layers: int, vocab: int, dtype, device: str, reps: int) -> dict:
    """FLOP/s of torch.matmul over one training step's GEMMs: forward, input grad, weight grad."""
    shapes = [((tokens, d, 3 * d), layers), ((tokens, d, d), layers), ((tokens, d, 4 * d), layers),
              ((tokens, 4 * d, d), layers), ((tokens, d, vocab), 1)]
    total_flops, total_s, per_shape = 0.0, 0.0, []
    for (m, k, n), count in shapes:
        x = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(k, n, device=device, dtype=dtype)
        g = torch.randn(m, n, device=device, dtype=dtype)
        s = (_time_matmul(x, w, reps, device)            # forward: x @ W
             + _time_matmul(g, w.t(), reps, device)      # input gradient: g @ W^T
             + _time_matmul(x.t(), g, reps, device))     # weight gradient: x^T @ g
        flops = 3 * 2 * m * k * n
        per_shape.append((f"{m}x{k}x{n}", flops / s))
        total_flops += count * flops
        total_s += count * s
        del x, w, g
    return {"flops_per_s": total_flops / total_s, "per_shape": per_shape}


def pct(v) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256,512,768,1024", help="widths d, comma-separated")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--vocab", type=int, default=4096, help="the project's vocabulary (config/config.yaml)")
    p.add_argument("--head-dim", type=int, default=64, help="head size (the project's config uses 16)")
    p.add_argument("--warm", type=int, default=5, help="untimed steps (compilation, allocator warm-up)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions of each GEMM")
    p.add_argument("--compile", nargs="?", const="default", default=False, choices=COMPILE_MODES,
                   help="torch.compile both loops in this mode (train.compile; no value: default)")
    p.add_argument("--sync-every", type=int, default=0, help="train.sync_every (0: automatic, 32 on CUDA)")
    p.add_argument("--no-reference", action="store_true", help="skip the reference loop")
    p.add_argument("--peak-flops", type=float, default=None, help="override the device's dense bf16 peak")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None, help="CSV file for the table")
    p.add_argument("--no-gemm", action="store_true", help="skip the matmul ceiling")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny sizes on the CPU: checks that it runs; throughput only, MFU n/a")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.device, args.sizes, args.layers, args.context, args.batch = "cpu", "32,64", 2, 64, 4
        args.vocab, args.head_dim, args.warm, args.steps, args.reps = 256, 16, 1, 2, 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: use --cpu-smoke for the reduced CPU form", file=sys.stderr)
        return 2
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    peak = peak_flops(args.device, args.peak_flops)
    print(f"# {device_name(args.device)}, torch {torch.__version__}, peak "
          f"{'n/a' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'} (dense bf16), "
          f"{'bf16 autocast' if cuda else 'fp32'}, layers {args.layers}, context {args.context}, batch "
          f"{args.batch}, vocab {args.vocab}, head_dim {args.head_dim}, compile {args.compile}", flush=True)
    data = np.random.default_rng(0).integers(0, args.vocab, 1 << 22).astype(np.uint16)
    rows = []
    for d in (int(s) for s in args.sizes.split(",")):
        model = build_model(seed=0, n_embd=d, n_layer=args.layers, vocab_size=args.vocab,
                            n_positions=args.context, head_dim=args.head_dim)
        fpt = model_train_flops_per_token(model.config, args.context)
        ref = None if args.no_reference else RefGPT.like(model.config).load_hf_weights(model)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            rate, summary = train_rate(model, data, batch=args.batch, context=args.context, warm=args.warm,
                                       steps=args.steps, device=args.device, compile=args.compile,
                                       sync_every=args.sync_every, peak=peak)
        except torch.OutOfMemoryError:
            print(f"d={d}: out of memory at batch {args.batch}; try --batch {args.batch // 2}", flush=True)
            del model
            torch.cuda.empty_cache()
            continue
        achieved = rate * fpt
        row = {"d": d, "layers": args.layers, "heads": model.config.n_head, "batch": args.batch,
               "context": args.context, "vocab": args.vocab, "params": n_params(model),
               "compile": args.compile, "sync_every": args.sync_every, "tokens_per_s": round(rate, 1),
               "step_ms": round(1e3 * args.batch * args.context / rate, 2),
               "model_tflops": float(f"{achieved / 1e12:.4g}"),
               "peak_tflops": None if peak is None else round(peak / 1e12, 1),
               "mfu": mfu(achieved, peak), "train_mfu": (summary.get("gpu_settings") or {}).get("mfu"),
               "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None}
        del model, summary
        if ref is not None:
            ref_rate = reference_rate(ref, data, batch=args.batch, context=args.context, warm=args.warm,
                                      steps=args.steps, device=args.device, compile=args.compile)
            row.update(ref_tokens_per_s=round(ref_rate, 1), ref_mfu=mfu(ref_rate * fpt, peak),
                       ratio_to_reference=round(rate / ref_rate, 3))
            del ref
        if cuda:
            torch.cuda.empty_cache()
        if not args.no_gemm:
            g = gemm_ceiling(tokens=args.batch * args.context, d=d, layers=args.layers, vocab=args.vocab,
                             dtype=dtype, device=args.device, reps=args.reps)
            row["gemm_tflops"] = float(f"{g['flops_per_s'] / 1e12:.4g}")
            row["gemm_ceiling"] = mfu(g["flops_per_s"], peak)
            print(f"  d={d} GEMMs (fwd+dgrad+wgrad): " + ", ".join(f"{s} {f / 1e12:.3g}" for s, f in g["per_shape"])
                  + " TFLOP/s", flush=True)
        rows.append(row)
        print(f"  d={d}: {rate:,.0f} tok/s, {achieved / 1e12:.1f} model TFLOP/s, MFU {pct(row['mfu'])}"
              + (f"; reference {row['ref_tokens_per_s']:,.0f} tok/s (MFU {pct(row['ref_mfu'])}), ratio "
                 f"{row['ratio_to_reference']:.3f}" if "ratio_to_reference" in row else ""), flush=True)

    print(f"{'d':>5} {'heads':>5} {'params':>11} {'tok/s':>10} {'step ms':>8} {'TFLOP/s':>8} {'MFU':>6} "
          f"{'train()':>7} {'ref MFU':>7} {'vs ref':>6} {'GEMM TF/s':>9} {'ceiling':>7} {'mem GB':>6}")
    for r in rows:
        print(f"{r['d']:>5} {r['heads']:>5} {r['params']:>11,} {r['tokens_per_s']:>10,.0f} {r['step_ms']:>8.1f} "
              f"{r['model_tflops']:>8.1f} {pct(r['mfu']):>6} {pct(r['train_mfu']):>7} {pct(r.get('ref_mfu')):>7} "
              f"{r.get('ratio_to_reference', float('nan')):>6.3f} "
              f"{r.get('gemm_tflops', float('nan')):>9.1f} {pct(r.get('gemm_ceiling')):>7} "
              f"{'' if r['peak_mem_gb'] is None else r['peak_mem_gb']:>6}")
    if peak is None:
        print("MFU n/a: no known peak for this device (CPU, or a GPU not in growlm.devices; see --peak-flops)")
    if args.out:
        cols = ["d", "layers", "heads", "batch", "context", "vocab", "params", "compile", "sync_every", "tokens_per_s",
                "step_ms", "model_tflops", "peak_tflops", "mfu", "train_mfu", "ref_tokens_per_s", "ref_mfu",
                "ratio_to_reference", "gemm_tflops", "gemm_ceiling", "peak_mem_gb"]
        with open(args.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in cols})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
