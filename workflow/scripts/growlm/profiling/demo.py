"""A tiny stand-alone training loop (plain torch, no transformers) for the tests and tool probes.

It honours the same environment variables as the real training loop (`session_from_env`), so the
profiling driver can run it under every profiler: ``python -m growlm.profiling.demo``.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

from growlm.profiling.ranges import ENV_STEPS, ENV_WARMUP, phase, session_from_env


def demo_workload(steps: int = 3, warmup: int = 1, *, width: int = 64, seq: int = 32,
                   batch: int = 8, vocab: int = 128) -> None:
    """A tiny stand-alone training loop (plain torch, no transformers) used by the tests and the
    probes; honours the same env vars as the real training loop. Run it as
    ``python -c "from growlm.profiling.demo import demo_workload as w; w()"``."""
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, width),
        torch.nn.TransformerEncoderLayer(width, nhead=max(1, width // 16), dim_feedforward=4 * width,
                                         batch_first=True, dropout=0.0),
        torch.nn.Linear(width, vocab),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx, step_fn = session_from_env(warmup=warmup, steps=steps)
    total = int(os.environ.get(ENV_WARMUP, warmup)) + int(os.environ.get(ENV_STEPS, steps))
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if dev == "cuda"
                else contextlib.nullcontext())
    with ctx:
        for i in range(total):
            with phase("data"):
                x = torch.randint(0, vocab, (batch, seq), device=dev)
            with phase("forward"), autocast:
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(),
                                                         x[:, 1:].reshape(-1))
            with phase("backward"):
                loss.backward()
            with phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            if i == total - 1:
                with phase("eval"), torch.no_grad():
                    model(x)
            step_fn()


DEMO_WORKLOAD = [sys.executable, "-c", "from growlm.profiling.demo import demo_workload as w; w()"]



if __name__ == "__main__":
    demo_workload()
