"""The workload a profiling job runs: a few real training steps of one model kind.

    python -m growlm.profiling.workload --kind small|baseline|refine --train TRAIN --model MODEL \\
        --width D --depth L --vocab V --tokens FILE.npy|random:N --steps S [--grown DIR]

builds the model the workflow trains (a fresh small member, a fresh M_0, or the grown M'_1 at the
start of its refinement) and runs `growlm.train.train` for warm-up + captured steps on the token
file, in a throw-away checkpoint folder. TRAIN is the stage's training settings and MODEL the
model settings (JSON text or a file: `growlm.experiment.train_settings` / `model_settings`).
The training loop opens the profiler window itself (`growlm.profiling.ranges.session_from_env`). It
stops when the profiler that started it dies; the profiling job waits for it (`growlm.launch`).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from growlm.devices import choose_device
from growlm.errors import stop_with_parent
from growlm.growth import grow, load_grown
from growlm.methods import OPERATORS, growth_names
from growlm.model import build_model
from growlm.tokens import load_tokens
from growlm.train import train
from growlm.train_config import TrainConfig


def _json_arg(value: str) -> dict:
    return json.loads(Path(value).read_text()) if Path(value).is_file() else json.loads(value)


def build(kind: str, model: dict, *, width: int, depth: int, vocab: int, grown_dir: str | None,
          random_members: str | None = None) -> torch.nn.Module:
    """The model to profile. For kind 'refine' without a grown folder, `random_members`
    ('METHOD:N:D0:L0') grows freshly initialised members: the same shapes and kernels as a real
    M'_1, for profiling on a machine where no members were trained (the masks stay mid-ramp, as
    early in a refinement)."""
    if kind == "refine" and grown_dir:
        return load_grown(grown_dir)
    if kind == "refine":
        method, n, d0, l0 = random_members.split(":")
        members = [build_model(seed=i, **{**model, "n_embd": int(d0), "n_layer": int(l0), "vocab_size": vocab})
                   for i in range(int(n))]
        chain = growth_names(method)
        ramps = {key: 200_000 for name in chain for key in OPERATORS[name].ramps}
        return grow(members, chain, n_embd=width, n_layer=depth, seed=0, **ramps)
    return build_model(seed=0, **{**model, "n_embd": width, "n_layer": depth, "vocab_size": vocab})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=["small", "baseline", "refine"], required=True)
    ap.add_argument("--train", required=True, help="the stage's training settings (JSON text or file)")
    ap.add_argument("--model", required=True, help="the model settings (JSON text or file)")
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--depth", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--tokens", required=True, help="token file (.npy) to train on, or random:N")
    ap.add_argument("--grown", default=None, help="grown model folder (kind refine)")
    ap.add_argument("--random-members", default="concat:2:64:4",
                    help="kind refine without --grown: METHOD:N:D0:L0 grown from fresh members")
    ap.add_argument("--steps", type=int, required=True, help="warm-up + captured steps")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    stop_with_parent(os.getppid())  # SIGTERM when the profiler that started it dies (it may be a daemon of it)
    torch.set_num_threads(args.threads)
    cfg = TrainConfig.from_dict(_json_arg(args.train), device=choose_device())
    cfg = cfg.with_(tokens=args.steps * cfg.batch_size * cfg.context,
                    eval_interval=args.steps,  # one evaluation, at the end (the "eval" phase)
                    eval_tokens=min(cfg.eval_tokens, 4 * cfg.batch_size * cfg.context),
                    final_eval_tokens=min(cfg.eval_tokens, 4 * cfg.batch_size * cfg.context),
                    checkpoint_every=10**9)
    model = build(args.kind, _json_arg(args.model), width=args.width, depth=args.depth, vocab=args.vocab,
                  grown_dir=args.grown, random_members=args.random_members)
    if args.tokens.startswith("random:"):  # random token ids: profiling needs no real text
        tokens = np.random.default_rng(0).integers(0, args.vocab, int(args.tokens[7:])).astype(np.uint16)
    else:
        tokens = load_tokens(args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        train(model, tokens, tokens, cfg, ckpt_dir=f"{tmp}/ckpt", ledger_path=f"{tmp}/ledger.csv", log=print)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
