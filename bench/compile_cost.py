"""What compiling costs a refinement against M_0: one job's compile time and whole time, cold cache.

A job of the compiled tiny experiment is seconds of training and, with `train.compile`, more seconds of
compiling. This benchmark trains M_0 and the refinements of msg and concat (+ zero_block) at the tiny
experiment's shapes (members d 16 x 1 layer, M_0 and M_1 d 32 x 2 layers, context 32, vocabulary 512,
batch 8, a ramp of 30 of 60 steps) with `growlm.train.train`, each in its own process with an empty
inductor cache whose one-time set-up (the compiler's toolchain checks, about 10 s on 2 cores) is paid
before the clock starts by compiling a two-operation function, so every job compiles from nothing what
it needs and nothing else. Each grown arm runs with its ramps eager (`train.compile_ramps: false`, the
default) and compiled (`true`). The table gives each job's seconds and its compile seconds (the
ledger's `compile_s`) and the job over M_0's of the same round (median over rounds); the last line is
`compile_cost msg=<ratio> concat=<ratio>` for the default (goal: at most 1.3).

    PYTHONPATH=workflow/scripts python bench/compile_cost.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = (("M_0", False), ("msg", False), ("msg", True), ("concat", False), ("concat", True))
V, T, BATCH, STEPS, RAMP = 512, 32, 8, 60, 30


def one_job(arm: str, compile_ramps: bool) -> dict:
    """In this process (a fresh one, with its own cache): train `arm`; {total_s, compile_s}."""
    import numpy as np
    import pandas as pd
    import torch

    torch.set_num_threads(1)
    setup = torch.compile(lambda x: (x.sin() * 2).sum())  # the compiler's one-time set-up, off the clock
    setup(torch.randn(8, requires_grad=True)).backward()
    from growlm.growth import grow
    from growlm.model import build_model
    from growlm.train import train
    from growlm.train_config import TrainConfig

    def model(seed, d, layers):
        return build_model(seed=seed, n_embd=d, n_layer=layers, vocab_size=V, n_positions=T, head_dim=8)

    if arm == "M_0":
        m = model(0, 32, 2)
    elif arm == "msg":
        m = grow([model(1, 16, 1)], "msg", n_embd=32, n_layer=2, seed=0, ramp_steps=RAMP)
    else:
        m = grow([model(1, 16, 1), model(2, 16, 1)], ["concat", "zero_block"], n_embd=32, n_layer=2, seed=0,
                 ramp_steps=RAMP, ln_ramp_steps=RAMP, cross="random")
    tokens = np.random.default_rng(0).integers(0, V, 200_000).astype(np.uint16)
    cfg = TrainConfig(tokens=STEPS * BATCH * T, batch_size=BATCH, context=T, lr=1e-3, warmup_steps=5,
                      eval_interval=20, eval_tokens=2048, final_eval_tokens=2048, checkpoint_every=10**6, dense_log_steps=0, compile=True,
                      compile_ramps=compile_ramps)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        train(m, tokens, tokens[:5000], cfg, ckpt_dir=Path(tmp) / "ck", ledger_path=Path(tmp) / "l.csv",
              log=lambda *a: None)
        total = time.perf_counter() - t0
        compile_s = float(pd.read_csv(Path(tmp) / "l.csv").iloc[-1]["compile_s"])
    return {"total_s": total, "compile_s": compile_s}


def run_job(arm: str, compile_ramps: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        out = subprocess.run([sys.executable, __file__, "--job", arm, str(int(compile_ramps))], env=env,
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--job", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        print(json.dumps(one_job(args.job[0], bool(int(args.job[1])))))
        return 0
    import torch

    print(f"# torch {torch.__version__}, one thread per job, {args.rounds} rounds, a fresh cache per job", flush=True)
    got = {a: [] for a in ARMS}
    for r in range(args.rounds):
        for a in ARMS:
            got[a].append(run_job(*a))
            print(f"  round {r}: {a[0]}{' (ramps compiled)' if a[1] else ''}: {got[a][-1]['total_s']:.1f} s, "
                  f"{got[a][-1]['compile_s']:.1f} s compiling", flush=True)
    ratio = {a: statistics.median(got[a][r]["total_s"] / got[ARMS[0]][r]["total_s"] for r in range(args.rounds))
             for a in ARMS}
    print(f"{'job':>8} {'ramps':>9} {'job s':>7} {'compile s':>10} {'job / M_0':>10}")
    for a in ARMS:
        ramps = "-" if a[0] == "M_0" else ("compiled" if a[1] else "eager")
        print(f"{a[0]:>8} {ramps:>9} {statistics.median(g['total_s'] for g in got[a]):>7.1f} "
              f"{statistics.median(g['compile_s'] for g in got[a]):>10.1f} {ratio[a]:>10.2f}")
    print(f"compile_cost msg={ratio[('msg', False)]:.2f} concat={ratio[('concat', False)]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
