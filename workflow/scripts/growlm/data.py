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


def eval_windows(tokens: np.ndarray, *, context: int, max_tokens: int | None = None) -> int:
    """How many windows an evaluation of up to `max_tokens` tokens reads (None: every whole window of the
    split; at least one). The last `(tokens.size - 1) % context` tokens, fewer than a window, are never read,
    so every window has the same length and the same spread of positions (each token's loss depends on how
    much context precedes it in its window)."""
    n_win = (tokens.size - 1) // context
    if max_tokens is not None:
        n_win = min(n_win, max(1, max_tokens // context))
    if n_win < 1:
        raise GrowlmError(f"evaluation split has {tokens.size} tokens, fewer than one window of {context}")
    return n_win


def eval_batches(tokens: np.ndarray, *, batch_size: int, context: int, max_tokens: int | None = None,
                 start: int = 0):
    """Non-overlapping windows covering the split (up to `max_tokens`), for held-out metrics, in order; from
    window `start` on (the windows before it are read as batches of their own: `growlm.loss.validation_loss`)."""
    n_win = eval_windows(tokens, context=context, max_tokens=max_tokens)
    offsets = np.arange(context + 1)[None, :]
    for i in range(start, n_win, batch_size):
        rows = np.arange(i, min(i + batch_size, n_win))
        win = torch.from_numpy(tokens[rows[:, None] * context + offsets].astype(np.int64))
        yield win[:, :-1], win[:, 1:]
