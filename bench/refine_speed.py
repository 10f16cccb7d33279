"""A refinement step against M_0's step: tokens/s of msg, concat and the V-cycle's refinement over M_0's.

Every arm is trained by `growlm.train.train` itself (the function the workflow's jobs run), at one
shape (the default experiment's M_0: d 128, 4 layers, context 128, vocabulary 4096, batch 16), timed
from its `step_callback`:

* M_0: a model of that shape from scratch;
* msg: grown from one member of half the width and depth (a `GrownModel` with growth masks);
* concat: two members of half the width side by side (masks on the cross-member weights and
  grouped norms faded into full width), then `zero_block` to the depth;
* vcycle: the V-cycle's M'_1 (M_0's initialisation coalesced by 2, de-coalesced and interpolated
  with itself): a plain model, so its refinement is M_0's step by construction.

Each grown arm has a mask ramp of `--ramp` steps; the run goes `--after` steps past it. Its rate
*during* the ramp is tokens per step over the median step time of steps 2..ramp-1 (the masked model),
*after* it over the median of the steps after the first one past the ramp (the plain model; the step
where it switches, which also compiles it, is left out). M_0 is timed over the same windows of its
own run. The arms run alternately in one process (the order rotates every round), and the table
gives the median over rounds of each arm's rate over M_0's of the same round, in each `--compile`
mode: `off` (eager), `on` (torch.compile's default mode, the ramps eager: `train.compile: true`, the
workflow's default with it), `ramps` (the masked form compiled too: `train.compile_ramps: true`),
`all` (the three; compile time is what the first step of each structure takes, never counted in a
window). With both compiled modes (`on` and `ramps`) it also gives each grown arm's break-even ramp
length: the seconds that compiling the masked form cost (the run's `compile_s` with `ramps` less the
one with `on`: the plain model compiles in both) over the seconds it saves per ramp step (the eager
masked step's time less the compiled one's): a ramp longer than that earns its compilation back, and
`train.compile_ramps: true` pays. `--out` writes the table (and the break-even lengths) as CSV. The
last line is
`refine_speed during=<the smallest during-ratio> after=<the smallest after-ratio>` (goals: 0.85 and 0.95).

    PYTHONPATH=workflow/scripts python bench/refine_speed.py                 # CPU, the three modes
    PYTHONPATH=workflow/scripts python bench/refine_speed.py --quick         # a smoke run, seconds
    PYTHONPATH=workflow/scripts python bench/refine_speed.py --device cuda --d 768 --layers 12 \\
        --context 512 --vocab 8192 --head-dim 64 --batch 16                   # the GPU recipe's shape
"""

from __future__ import annotations

import argparse
import copy
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from growlm.growth import grow
from growlm.model import build_model
from growlm.schedules.vcycle import coalesce, interpolate
from growlm.train import train
from growlm.train_config import TrainConfig

ARMS = ("M_0", "msg", "concat", "vcycle")


def models(args) -> dict:
    """The initial model of every arm, at one shape (see the module docstring)."""
    kw = dict(vocab_size=args.vocab, n_positions=args.context, head_dim=args.head_dim)
    m0 = build_model(seed=0, n_embd=args.d, n_layer=args.layers, **kw)
    half = [build_model(seed=1 + i, n_embd=args.d // 2, n_layer=max(1, args.layers // 2), **kw) for i in range(2)]
    full_depth = [build_model(seed=3 + i, n_embd=args.d // 2, n_layer=args.layers, **kw) for i in range(2)]
    ramp = {"ramp_steps": args.ramp}
    return {
        "M_0": m0,
        "msg": grow(half[:1], "msg", n_embd=args.d, n_layer=args.layers, seed=0, **ramp),
        "concat": grow(full_depth, "concat", n_embd=args.d, n_layer=args.layers, seed=0, cross="random",
                       ln_ramp_steps=args.ramp, **ramp),
        "vcycle": interpolate(m0, coalesce(copy.deepcopy(m0), factor=2), 0.5, factor=2),
    }


MODES = {"off": (False, False), "on": (True, False), "ramps": (True, True)}  # (train.compile, train.compile_ramps)


def timed_run(model, data, args, *, mode: str, seed: int) -> dict:
    """Train a copy of `model` for ramp + after steps; {window: tokens/s} from the median step time, and
    the seconds the run spent compiling (`compile_s` of its summary: what the steps that compiled took
    beyond a plain step)."""
    stamps: dict[int, float] = {}

    def on_step(done: int) -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        stamps[done] = time.perf_counter()

    steps = args.ramp + args.after
    cfg = TrainConfig(tokens=steps * args.batch * args.context, batch_size=args.batch, context=args.context,
                      lr=1e-3, warmup_steps=5, eval_interval=10**9, eval_tokens=args.context,
                      final_eval_tokens=args.context,
                      checkpoint_every=10**9, dense_log_steps=0, seed=seed, device=args.device,
                      compile=MODES[mode][0], compile_ramps=MODES[mode][1])
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(copy.deepcopy(model), data, data, cfg, ckpt_dir=Path(tmp) / "ck",
                        ledger_path=Path(tmp) / "l.csv", log=lambda s: None, step_callback=on_step)
    per = {k: stamps[k] - stamps[k - 1] for k in stamps if k - 1 in stamps}  # step k's time (k = steps done)
    tps = args.batch * args.context
    during = [per[k] for k in range(3, args.ramp) if k in per]  # masked steps, past the first (compile)
    after = [per[k] for k in range(args.ramp + 2, steps) if k in per]  # plain steps, past the switch, not the last
    return {"during": tps / statistics.median(during), "after": tps / statistics.median(after),
            "compile_s": summary["compile_s"]}


def break_even(rows: list[dict], tokens_per_step: int) -> dict[str, float]:
    """{grown arm: ramp steps from which compiling its masked form pays} from the `on` and `ramps` rows:
    the extra compile seconds over the seconds saved per ramp step (inf when the compiled masked step
    is not faster)."""
    by = {(r["compile"], r["arm"]): r for r in rows}
    out = {}
    for arm in ("msg", "concat"):
        if ("on", arm) in by and ("ramps", arm) in by:
            eager, compiled = by[("on", arm)], by[("ramps", arm)]
            cost = compiled["arm_compile_s"] - eager["arm_compile_s"]
            saved = tokens_per_step * (1 / eager["during_tok_s"] - 1 / compiled["during_tok_s"])
            out[arm] = max(cost, 0.0) / saved if saved > 0 else float("inf")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--ramp", type=int, default=12, help="mask-ramp steps of the grown arms")
    p.add_argument("--after", type=int, default=12, help="steps after the ramp")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--compile", choices=(*MODES, "all"), default="all")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None, help="CSV file for the table")
    p.add_argument("--quick", action="store_true", help="smoke run: d 32, 2 layers, 1 round, compile off")
    args = p.parse_args(argv)
    if args.quick:
        args.d, args.layers, args.vocab, args.context, args.batch, args.head_dim = 32, 2, 256, 32, 4, 8
        args.ramp, args.after, args.rounds, args.compile = 6, 6, 1, "off"
    if args.threads:
        torch.set_num_threads(args.threads)
    data = np.random.default_rng(0).integers(0, args.vocab, 1 << 20).astype(np.uint16)
    init = models(args)
    modes = list(MODES) if args.compile == "all" else [args.compile]
    print(f"# torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, d {args.d} x "
          f"{args.layers} layers, vocab {args.vocab}, batch {args.batch} x context {args.context}, ramp {args.ramp} "
          f"+ {args.after} steps, {args.rounds} rounds", flush=True)
    rows = []
    for comp in modes:
        ratios = {arm: {"during": [], "after": []} for arm in ARMS[1:]}
        got_all = {arm: [] for arm in ARMS}
        for r in range(args.rounds):
            order = ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]
            got = {arm: timed_run(init[arm], data, args, mode=comp, seed=r) for arm in order}
            for arm in ARMS[1:]:
                for w in ("during", "after"):
                    ratios[arm][w].append(got[arm][w] / got["M_0"][w])
            for arm in ARMS:
                got_all[arm].append(got[arm])
            print(f"  compile {comp} round {r}: " + "  ".join(
                f"{arm} {got[arm]['during']:.0f}/{got[arm]['after']:.0f}" for arm in ARMS) + " tok/s (during/after)",
                flush=True)

        def med(arm, key):
            return statistics.median(g[key] for g in got_all[arm])

        for arm in ARMS[1:]:
            rows.append({"compile": comp, "arm": arm, "m0_tok_s": med("M_0", "after"), "arm_tok_s": med(arm, "after"),
                         "during": statistics.median(ratios[arm]["during"]),
                         "after": statistics.median(ratios[arm]["after"]),
                         "during_tok_s": med(arm, "during"), "m0_compile_s": med("M_0", "compile_s"),
                         "arm_compile_s": med(arm, "compile_s")})
    print(f"{'compile':>7} {'arm':>7} {'M_0 tok/s':>10} {'arm tok/s':>10} {'during/M_0':>11} {'after/M_0':>10} "
          f"{'compile s':>9}")
    for r in rows:
        print(f"{r['compile']:>7} {r['arm']:>7} {r['m0_tok_s']:>10.0f} {r['arm_tok_s']:>10.0f} {r['during']:>11.3f} "
              f"{r['after']:>10.3f} {r['arm_compile_s']:>9.1f}")
    even = break_even(rows, args.batch * args.context)
    for r in rows:
        r["break_even_ramp_steps"] = round(even[r["arm"]], 1) if r["compile"] == "ramps" and r["arm"] in even else ""
    if even:
        print("compile_ramps pays from a ramp of " + ", ".join(f"{arm} {n:.0f}" for arm, n in even.items())
              + " steps (break-even: the masked form's compile seconds over the seconds it saves per ramp step)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.out}")
    print(f"refine_speed during={min(r['during'] for r in rows):.3f} after={min(r['after'] for r in rows):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
