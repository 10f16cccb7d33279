"""The workload a profiling job runs: a few real training steps of one model kind.

`python -m growlm.profile_workload --kind small|baseline|refine ...` builds the model the workflow
trains (a fresh small member, a fresh M_0, or the grown M'_1 at the start of its refinement) and
runs `growlm.train.train` for warm-up + captured steps on the real token file, in a throw-away
checkpoint folder. The training loop opens the profiler window itself (`session_from_env`).
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch

from growlm.data import load_tokens
from growlm.experiment import model_kwargs, train_config
from growlm.jobs import choose_device


def build(kind: str, config: dict, *, width: int, depth: int, vocab: int, grown_dir: str | None,
          random_members: str | None = None):
    """The model to profile. For kind 'refine' without a grown folder, `random_members`
    ('METHOD:N:D0:L0') grows freshly initialised members: the same shapes and kernels as a real
    M'_1, for profiling on a machine where no members were trained."""
    from growlm.model import build_model

    if kind == "refine" and grown_dir:
        from growlm.growth import load_grown

        return load_grown(grown_dir)
    if kind == "refine":
        from growlm.growth import grow

        method, n, d0, l0 = random_members.split(":")
        members = [build_model(seed=i, **model_kwargs(config, n_embd=int(d0), n_layer=int(l0), vocab_size=vocab))
                   for i in range(int(n))]
        from growlm.jobs import growth_options

        chain = method.split("+")  # masks stay mid-ramp: the masked kernels of early refinement
        return grow(members, chain, n_embd=width, n_layer=depth, seed=0,
                    **growth_options(chain, {}, refine_steps=10**6))
    return build_model(seed=0, **model_kwargs(config, n_embd=width, n_layer=depth, vocab_size=vocab))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kind", choices=["small", "baseline", "refine"], required=True)
    ap.add_argument("--config", required=True, help="the experiment config as JSON")
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--depth", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--tokens", required=True, help="token file (.npy) to train on")
    ap.add_argument("--grown", default=None, help="grown model folder (kind refine)")
    ap.add_argument("--random-members", default="concat:2:64:4",
                    help="kind refine without --grown: METHOD:N:D0:L0 grown from fresh members")
    ap.add_argument("--steps", type=int, required=True, help="warm-up + captured steps")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = json.loads(open(args.config).read())
    stage = {"small": "small", "baseline": "large", "refine": "refine"}[args.kind]
    device = choose_device()
    cfg = train_config(config, stage, seed=0, device=device)
    cfg.tokens = args.steps * cfg.batch_size * cfg.context
    cfg.eval_interval = args.steps  # one evaluation, at the end (the "eval" phase)
    cfg.eval_tokens = min(cfg.eval_tokens, 4 * cfg.batch_size * cfg.context)
    cfg.checkpoint_every = 10**9
    model = build(args.kind, config, width=args.width, depth=args.depth, vocab=args.vocab, grown_dir=args.grown,
                  random_members=args.random_members)
    if args.tokens.startswith("random:"):  # random token ids: profiling needs no real text
        import numpy as np

        tokens = np.random.default_rng(0).integers(0, args.vocab, int(args.tokens[7:])).astype(np.uint16)
    else:
        tokens = load_tokens(args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        train(model, tokens, tokens, cfg, ckpt_dir=f"{tmp}/ckpt", ledger_path=f"{tmp}/ledger.csv", log=print)
    return 0


from growlm.train import train  # noqa: E402  (after main's definition keeps the module readable)

if __name__ == "__main__":
    raise SystemExit(main())
