"""What a mode changes: M_0 of the tiny experiment trained in each mode, against the same run eager on 1 thread.

`train.compile`, `train.compile_ramps` and `train.threads` rerun nothing (growlm.modes): they decide how
the steps run, not what they compute, yet they change the order of floating-point sums. This benchmark
trains M_0 at the tiny experiment's shape (d 32, 2 layers, context 32, vocabulary 512, batch 8, 93 steps:
its 24,000 tokens, on a repeating sequence with 10 % noise) with `growlm.train.train` in each mode, every
run in a fresh process (inductor's cache empty), and prints each run's final validation loss, its relative
difference from the reference run (eager, 1 thread) and the largest relative difference of a weight. A
second reference run checks that one mode repeats itself bit for bit. The last line is
`modes same_mode=<max relative difference of the repeat> other_modes=<largest over the other modes>`.

    PYTHONPATH=workflow/scripts .venv/bin/python bench/modes.py          # on the CPU
    PYTHONPATH=workflow/scripts .venv/bin/python bench/modes.py --out bench/results/modes_cpu.csv   # and the table as CSV
    PYTHONPATH=workflow/scripts .venv/bin/python bench/modes.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

V, T, BATCH, TOKENS, D, L = 512, 32, 8, 24_000, 32, 2
MODES = (("eager", 1), ("eager", 1), ("eager", 2), ("compiled", 1), ("compiled", 2))  # the first is the reference


def one_run(compiled: bool, threads: int, device: str, out: Path) -> dict:
    """In this process (a fresh one): train M_0 in the mode; its final validation loss and mode; the
    weights to `out`."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    torch.set_num_threads(threads)
    from growlm.loss import evaluate
    from growlm.model import build_model
    from growlm.train import train
    from growlm.train_config import TrainConfig

    rng = np.random.default_rng(0)
    base = np.tile(np.arange(V, dtype=np.uint16), 200_000 // V + 1)[:200_000]
    tokens = np.where(rng.random(base.size) < 0.1, rng.integers(0, V, base.size), base).astype(np.uint16)
    model = build_model(seed=0, n_embd=D, n_layer=L, vocab_size=V, n_positions=T, head_dim=8)
    cfg = TrainConfig(tokens=TOKENS, batch_size=BATCH, context=T, lr=3e-3, warmup_steps=5, eval_interval=20,
                      eval_tokens=2048, final_eval_tokens=2048, checkpoint_every=10**6, dense_log_steps=0, compile=compiled, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(model, tokens, tokens[-5000:], cfg, ckpt_dir=Path(tmp) / "ck", ledger_path=Path(tmp) / "l.csv",
                        log=lambda *a: None)
    # the ledger rounds its losses to 5 decimals: the final model's, in full, on the same held-out tokens
    loss = evaluate(model, tokens[-5000:], context=T, batch_size=BATCH, max_tokens=4096, device=device)["loss"]
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
               if not k.endswith("lm_head.weight")}, str(out))
    return {"val_loss": float(loss), "mode": summary["mode"]}


def run(compiled: bool, threads: int, device: str, out: Path) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        proc = subprocess.run([sys.executable, __file__, "--run", str(int(compiled)), str(threads), device, str(out)],
                              env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=None, help="CSV file for the table (bench/RESULTS.md renders it)")
    p.add_argument("--run", nargs=4, help=argparse.SUPPRESS)  # one run, in a subprocess
    args = p.parse_args(argv)
    if args.run:
        compiled, threads, device, out = args.run
        print(json.dumps(one_run(bool(int(compiled)), int(threads), device, Path(out))))
        return 0
    import torch
    from safetensors.torch import load_file

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (how, threads) in enumerate(MODES):
            out = Path(tmp) / f"{i}.safetensors"
            rows.append({**run(how == "compiled", threads, args.device, out), "weights": load_file(str(out))})
    ref = rows[0]

    def weight_diff(w: dict) -> float:
        return max(float(((w[k].double() - r.double()).abs().max() / r.double().abs().max().clamp_min(1e-30)))
                   for k, r in ref["weights"].items())

    print(f"M_0 d{D} x {L}, {TOKENS} tokens, on {args.device}; reference: run 1 ({ref['mode']})")
    print(f"{'run':>3}  {'mode':<32} {'final val loss':>16} {'rel. diff':>10} {'max weight rel. diff':>21}")
    diffs, table = [], []
    for i, r in enumerate(rows, start=1):
        loss_diff = abs(r["val_loss"] - ref["val_loss"]) / ref["val_loss"]
        wd = weight_diff(r["weights"])
        diffs.append(max(loss_diff, wd))
        table.append({"run": i, "mode": r["mode"], "final_val_loss": f"{r['val_loss']:.12f}",
                      "loss_rel_diff": f"{loss_diff:.3e}", "max_weight_rel_diff": f"{wd:.3e}",
                      "torch": torch.__version__, "device": args.device})
        print(f"{i:>3}  {r['mode']:<32} {r['val_loss']:>16.9f} {loss_diff:>10.2e} {wd:>21.2e}")
    if args.out:
        import csv

        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    others = [d for (how, threads), d in zip(MODES[2:], diffs[2:])]
    print(f"modes same_mode={diffs[1]:.2e} other_modes={max(others):.2e}")
    del torch
    return 0


if __name__ == "__main__":
    sys.exit(main())
