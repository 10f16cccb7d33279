"""Tokenized splits on disk and the batches every training job reads.

Each split of each level is stored once as a flat array of uint16 token ids (`.npy`), sentences
separated by the end-of-text token, and memory-mapped by every job. A batch is `batch_size`
windows of `context + 1` tokens at positions drawn from a generator seeded by (seed, step), so a
job's batch at step k is the same whether or not it was interrupted before step k.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from growlm.errors import GrowlmError

if TYPE_CHECKING:
    import torch


def encode_file(text_file: str | Path, tokenizer, out_file: str | Path, *, batch_lines: int = 4096) -> int:
    """Encode one sentence per line into a flat uint16 array with EOS after every sentence."""
    eos = tokenizer.eos_token_id
    if tokenizer.vocab_size + len(tokenizer.get_added_vocab()) > 65535:
        raise GrowlmError("vocabulary too large for uint16 token files (max 65535)")
    with open(text_file, encoding="utf-8") as fh:
        lines = [ln.rstrip("\n") for ln in fh if ln.strip()]
    if not lines:
        raise GrowlmError(f"{text_file} has no sentences")
    chunks = []
    for i in range(0, len(lines), batch_lines):
        enc = tokenizer(lines[i : i + batch_lines], add_special_tokens=False)["input_ids"]
        for ids in enc:
            chunks.append(np.asarray(ids + [eos], dtype=np.uint16))
    arr = np.concatenate(chunks)
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    np.save(out_file, arr)
    return int(arr.size)


def load_tokens(path: str | Path) -> np.ndarray:
    """Memory-map a token file written by `encode_file`."""
    path = Path(path)
    if not path.is_file():
        raise GrowlmError(f"token file {path} does not exist")
    try:
        arr = np.load(path, mmap_mode="r")
    except Exception as err:
        raise GrowlmError(f"token file {path} is unreadable: {err}") from err
    if arr.ndim != 1 or arr.dtype != np.uint16:
        raise GrowlmError(f"token file {path} is not a flat uint16 array")
    return arr


def shard(tokens: np.ndarray, index: int, count: int) -> np.ndarray:
    """Contiguous shard `index` of `count` (members trained on disjoint data)."""
    if not 0 <= index < count:
        raise GrowlmError(f"shard index {index} out of range for {count} shards")
    size = tokens.size // count
    return tokens[index * size : (index + 1) * size]


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
        import torch  # here, not at the top: encoding a split (encode_split jobs) needs no torch

        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, self.tokens.size - self.context - 1, size=self.batch_size)
        idx = starts[:, None] + np.arange(self.context + 1)[None, :]
        win = torch.from_numpy(self.tokens[idx].astype(np.int64))
        return win[:, :-1], win[:, 1:]


def eval_batches(tokens: np.ndarray, *, batch_size: int, context: int, max_tokens: int | None = None):
    """Non-overlapping windows covering the split (up to `max_tokens`), for held-out metrics."""
    import torch

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
