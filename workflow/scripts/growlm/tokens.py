"""Tokenised splits on disk: one flat array of token ids per split, memory-mapped by every job.

Each split of each level is stored once as a `.npy` array of uint16 token ids, sentences separated
by the end-of-text token, with its sha256 beside it (`.npy.sha256`) so that a damaged file is named
before a job trains on it. No torch: the encoding jobs import only `tokenizers` and numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from growlm.errors import GrowlmError, check_recorded_sha256, damaged, record_sha256
from growlm.tokenizer import eos_id


def encode_file(text_file: str | Path, tokenizer: Tokenizer, out_file: str | Path, *, batch_lines: int = 4096) -> int:
    """Encode one sentence per line into a flat uint16 array with EOS after every sentence."""
    eos = eos_id(tokenizer)
    if tokenizer.get_vocab_size(with_added_tokens=True) > 65535:
        raise GrowlmError("vocabulary too large for uint16 token files (max 65535)")
    with open(text_file, encoding="utf-8") as fh:
        lines = [ln.rstrip("\n") for ln in fh if ln.strip()]
    if not lines:
        raise GrowlmError(f"{text_file} has no sentences")
    chunks = []
    for i in range(0, len(lines), batch_lines):
        for enc in tokenizer.encode_batch(lines[i:i + batch_lines], add_special_tokens=False):
            chunks.append(np.asarray(enc.ids + [eos], dtype=np.uint16))
    arr = np.concatenate(chunks)
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    np.save(out_file, arr)
    record_sha256(out_file)
    return int(arr.size)


def load_tokens(path: str | Path) -> np.ndarray:
    """Memory-map a token file written by `encode_file`, checked against the sha256 it recorded."""
    path = Path(path)
    if not path.is_file():
        raise GrowlmError(f"token file {path} does not exist")
    try:
        arr = np.load(path, mmap_mode="r")
    except Exception as err:
        raise damaged(path, f"not a readable .npy token file: {err}") from None
    if arr.ndim != 1 or arr.dtype != np.uint16:
        raise damaged(path, f"not a flat uint16 array but {arr.dtype} of shape {arr.shape}")
    check_recorded_sha256(path)
    return arr


def shard(tokens: np.ndarray, index: int, count: int) -> np.ndarray:
    """Contiguous shard `index` of `count` (members trained on disjoint data)."""
    if not 0 <= index < count:
        raise GrowlmError(f"shard index {index} out of range for {count} shards")
    size = tokens.size // count
    return tokens[index * size : (index + 1) * size]
