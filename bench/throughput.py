"""Training throughput of growlm's loop against a minimal nanoGPT-style loop, same architecture.

growlm's side is `growlm.train.train` itself, the function every workflow job runs, timed from a
`step_callback`: the interval between two callbacks is one whole loop iteration with its per-step
overheads (growth hook, lr update, phase ranges, BatchSampler, loss `.item()` and NaN check, clip,
AdamW, ledger bookkeeping). The first steps of each round (optimizer state creation, allocator
warm-up) and the last one (followed by the final evaluation) are not timed; the evaluation at step
0 is before the timed window.

The reference is `bench/reference_loop.py`: the same GPT-2 (checked equal to HF's GPT2LMHeadModel
weight for weight in tests/test_bench_smoke.py) trained by a plain loop. Both run in this process,
with the same threads, dtype (fp32 on CPU; bf16 autocast on CUDA), batch and context, alternately:
for each size, `--rounds` rounds, each timing growlm then the reference (the order flips every
round). A round's rate is tokens per step over the median step time (on the CPU, where other
processes' bursts hit single steps; `--block` and CUDA use the whole block's time). The table gives
median tokens/s and the median of the per-round ratios growlm/reference;
the last line is `throughput_ratio=<the smallest ratio over the sizes>`.

    PYTHONPATH=workflow/scripts python bench/throughput.py            # d = 64, 128, 256
    PYTHONPATH=workflow/scripts python bench/throughput.py --quick    # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_loop import RefGPT, RefTrainer  # noqa: E402

from growlm.model import build_model  # noqa: E402
from growlm.train import train  # noqa: E402
from growlm.train_config import TrainConfig  # noqa: E402

CLOCK = time.perf_counter  # `--clock cpu`: time.process_time, this process's CPU time


def _clock() -> float:
    return CLOCK()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _rate(stamps: list[float], tokens_per_step: int, per_step: bool) -> float:
    """tokens/s from the time stamps of consecutive step ends: per-step median, or the whole block."""
    if per_step:
        return tokens_per_step / statistics.median(b - a for a, b in zip(stamps, stamps[1:]))
    return (len(stamps) - 1) * tokens_per_step / (stamps[-1] - stamps[0])


def growlm_round(model, data, *, batch: int, context: int, warm: int, steps: int, device: str,
                 seed: int, per_step: bool) -> float:
    """tokens/s of `steps` iterations of growlm.train.train after `warm` untimed ones."""
    stamps: list[float] = []

    def on_step(done: int) -> None:
        if warm <= done <= warm + steps and (per_step or done in (warm, warm + steps)):
            _sync(device)
            stamps.append(_clock())

    total = warm + steps + 1  # the last step is followed by the final evaluation: not timed
    cfg = TrainConfig(tokens=total * batch * context, batch_size=batch, context=context, lr=1e-3,
                      warmup_steps=50, eval_interval=10**9, eval_tokens=context, final_eval_tokens=context,
                      checkpoint_every=10**9, dense_log_steps=0,
                      seed=seed, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        train(model, data, data, cfg, ckpt_dir=Path(tmp) / "ck", ledger_path=Path(tmp) / "ledger.csv",
              log=lambda s: None, step_callback=on_step)
    return _rate(stamps, batch * context, per_step)


def reference_round(trainer: RefTrainer, *, warm: int, steps: int, device: str, per_step: bool) -> float:
    for _ in range(warm):
        trainer.step()
    _sync(device)
    stamps = [_clock()]
    for i in range(steps):
        trainer.step(sync=(i % 10 == 9))  # nanoGPT reads the loss every log_interval (10) steps
        if per_step or i == steps - 1:
            _sync(device)
            stamps.append(_clock())
    return _rate(stamps, trainer.B * trainer.T, per_step)


def use_unfused_growlm() -> None:
    """`--unfused`: growlm's loop as it was before this benchmark (for the record of what changed):
    the head and loss through HF's logits + F.cross_entropy, and AdamW's per-tensor loop on the CPU."""
    import torch.nn.functional as F

    import growlm.train as gt

    def lm_loss(model, x, y, *, logits=True):
        out = model(input_ids=x).logits
        return F.cross_entropy(out.reshape(-1, out.size(-1)).float(), y.reshape(-1)), out

    def make_optimizer(model, cfg):
        opt = gt_make_optimizer(model, cfg)
        if torch.device(cfg.device).type == "cpu":
            groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in opt.param_groups]
            return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
        return opt

    gt_make_optimizer = gt.make_optimizer
    gt.lm_loss, gt.make_optimizer = lm_loss, make_optimizer
    probe = torch.nn.Linear(2, 2)
    assert not make_optimizer(probe, TrainConfig(tokens=1, batch_size=1, context=1, lr=1e-3, warmup_steps=0)).defaults["fused"]


def measure(d: int, args, data: np.ndarray, log=print) -> dict:
    kw = dict(n_embd=d, n_layer=args.layers, vocab_size=args.vocab, n_positions=args.context,
              head_dim=args.head_dim)
    hf = build_model(seed=0, **kw)
    ref = RefGPT.like(hf.config).load_hf_weights(hf)
    trainer = RefTrainer(ref, data, batch_size=args.batch, context=args.context, device=args.device,
                         total_steps=10**6)
    ours, theirs, ratios = [], [], []
    for r in range(args.rounds):
        order = ("growlm", "ref") if r % 2 == 0 else ("ref", "growlm")
        got = {}
        for who in order:
            if who == "growlm":
                got[who] = growlm_round(hf, data, batch=args.batch, context=args.context, warm=args.warm,
                                        steps=args.steps, device=args.device, seed=r,
                                        per_step=args.per_step)
            else:
                got[who] = reference_round(trainer, warm=args.warm, steps=args.steps, device=args.device,
                                           per_step=args.per_step)
        ours.append(got["growlm"])
        theirs.append(got["ref"])
        ratios.append(got["growlm"] / got["ref"])
        log(f"  d={d} round {r}: growlm {got['growlm']:9.0f} tok/s  reference {got['ref']:9.0f} tok/s  "
            f"ratio {ratios[-1]:.3f}")
    params = sum(p.numel() for p in {id(p): p for p in hf.parameters()}.values())
    return {"d": d, "params": params, "growlm": statistics.median(ours), "ref": statistics.median(theirs),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64,128,256", help="widths d, comma-separated")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warm", type=int, default=3, help="untimed steps at the start of each round")
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--block", action="store_true",
                   help="rate over the whole block of timed steps (default on CUDA) instead of the median "
                        "step time (default on the CPU, robust to other processes' bursts)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this process's CPU time (time.process_time) instead of wall time; on a "
                        "machine shared with other jobs, with --threads 1, it is the work done, not the "
                        "waiting (CPU only)")
    p.add_argument("--unfused", action="store_true",
                   help="growlm as before this benchmark: HF logits + F.cross_entropy, per-tensor AdamW")
    p.add_argument("--quick", action="store_true", help="smoke run: d=32, 2 layers, 2 rounds of 2 steps")
    p.add_argument("--out", default=None, help="CSV file for the table (bench/RESULTS.md renders it)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.layers, args.vocab, args.context, args.batch = "32", 2, 256, 32, 4
        args.rounds, args.warm, args.steps = 2, 1, 2
    if args.clock == "cpu":
        if args.device != "cpu":
            p.error("--clock cpu measures CPU work: use it with --device cpu")
        global CLOCK
        CLOCK = time.process_time
    if args.unfused:
        use_unfused_growlm()
    args.per_step = not (args.block or args.device.startswith("cuda"))
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    data = np.random.default_rng(0).integers(0, args.vocab, 1 << 20).astype(np.uint16)
    print(f"# torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, "
          f"dtype {'bf16 autocast' if args.device.startswith('cuda') else 'fp32'}, layers {args.layers}, "
          f"vocab {args.vocab}, batch {args.batch} x context {args.context}, {args.rounds} rounds x "
          f"{args.steps} timed steps (+{args.warm} warm), rate from the "
          f"{'median step time' if args.per_step else 'whole block'}, {args.clock} clock"
          f"{', growlm UNFUSED (as before)' if args.unfused else ''}", flush=True)
    results = [measure(d, args, data, log=lambda s: print(s, flush=True)) for d in sizes]
    print(f"{'d':>5} {'params':>10} {'growlm tok/s':>13} {'ref tok/s':>11} {'ratio':>7} {'(min..max)':>14}")
    for r in results:
        print(f"{r['d']:>5} {r['params']:>10} {r['growlm']:>13.0f} {r['ref']:>11.0f} {r['ratio']:>7.3f} "
              f"{r['ratio_min']:>6.3f}..{r['ratio_max']:.3f}")
    if args.out:
        import csv

        with open(args.out, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["d", "params", "growlm_tok_s", "ref_tok_s", "ratio", "ratio_min", "ratio_max", "rounds",
                             "steps", "threads", "clock", "unfused", "torch", "device"])
            for r in results:
                writer.writerow([r["d"], r["params"], f"{r['growlm']:.1f}", f"{r['ref']:.1f}", f"{r['ratio']:.4f}",
                                 f"{r['ratio_min']:.4f}", f"{r['ratio_max']:.4f}", args.rounds, args.steps,
                                 torch.get_num_threads(), args.clock, args.unfused, torch.__version__, args.device])
    print(f"throughput_ratio={min(r['ratio'] for r in results):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
