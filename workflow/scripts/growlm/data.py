"""The batches training and evaluation read from a token file.

A training batch is `batch_size` windows of `context + 1` tokens at positions drawn from a
generator seeded by (seed, step), so a job's batch at step k is the same whether or not it was
interrupted before step k. Evaluation reads non-overlapping windows in order.
"""

from __future__ import annotations

import numpy as np
import torch

from growlm.errors import GrowlmError


class BatchSampler:
    """Random windows from a flat token array; batch k depends only on (seed, k)."""

    def __init__(self, tokens: np.ndarray, *, batch_size: int, context: int, seed: int):
        if tokens.size < context + 2:
            raise GrowlmError(f"only {tokens.size} tokens, fewer than one window of {context + 1}")
        self.tokens = tokens
        self.batch_size = batch_size
        self.context = context
        self.seed = seed

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, self.tokens.size - self.context - 1, size=self.batch_size)
        idx = starts[:, None] + np.arange(self.context + 1)[None, :]
        win = torch.from_numpy(self.tokens[idx].astype(np.int64))
        return win[:, :-1], win[:, 1:]


def eval_batches(tokens: np.ndarray, *, batch_size: int, context: int, max_tokens: int | None = None):
    """Non-overlapping windows covering the split (up to `max_tokens`), for held-out metrics."""
    n_win = (tokens.size - 1) // context
    if max_tokens is not None:
        n_win = min(n_win, max(1, max_tokens // context))
    if n_win < 1:
        raise GrowlmError(f"evaluation split has {tokens.size} tokens, fewer than one window of {context}")
    for i in range(0, n_win, batch_size):
        rows = range(i, min(i + batch_size, n_win))
        idx = np.array([[r * context + j for j in range(context + 1)] for r in rows])
        win = torch.from_numpy(tokens[idx].astype(np.int64))
        yield win[:, :-1], win[:, 1:]
