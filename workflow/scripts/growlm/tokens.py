"""Tokenised splits on disk: one flat array of token ids per split, memory-mapped by every job.

Each split of each level is stored once as a `.npy` array of token ids, units (sentences or
documents) separated by the end-of-text token: uint16 while the vocabulary fits in 16 bits, uint32
beyond. Its sha256 lies beside it (`.npy.sha256`) so that a damaged file is named before a job
trains on it, and `.npy.sources.json` says which tokens came from which source ([start, end) per
source), for caps and for members specialised by book.

`encode_file` streams: it reads a split's lines in blocks, encodes each block with
`Tokenizer.encode_batch` (parallel over the job's cores in the tokenizers library) and appends the
ids to the file, whose header gets its final length at the end (`NpyWriter`); the corpus is never
held in memory. No torch: the encoding jobs import only `tokenizers` and numpy.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from growlm.corpus import line_blocks
from growlm.errors import GrowlmError, check_recorded_sha256, damaged, read_json, record_sha256
from growlm.tokenizer import eos_id

TOKEN_DTYPES = (np.uint16, np.uint32)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (vocab_size <= 65536), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class NpyWriter:
    """A flat `.npy` array written by appending blocks; the header is written first for length 0
    and rewritten with the final length on `close` (numpy pads the header so that the length can
    grow to 21 digits in place), so the file is what `np.save` writes for the same array."""

    def __init__(self, path: str | Path, dtype):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.dtype = np.dtype(dtype)
        self.size = 0
        self._fh = open(self.path, "wb")
        self._header(0)

    def _header(self, n: int) -> None:
        self._fh.seek(0)
        np.lib.format.write_array_header_1_0(
            self._fh, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (n,)})

    def write(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=self.dtype)
        self._fh.write(block.tobytes())
        self.size += block.size

    def close(self) -> None:
        self._header(self.size)
        self._fh.close()


def encode_file(text_file: str | Path, tokenizer: Tokenizer, out_file: str | Path, *, batch_lines: int = 8192,
                block_chars: int = 1 << 20, sources: dict[str, list[int]] | None = None, caps: dict[str, int] | None = None,
                threads: int | None = None, eos: int | None = None) -> int:
    """Encode one unit per line into a flat token array with EOS after every unit (`eos`, default the
    tokenizer's `<|endoftext|>`); return its length.

    Lines are encoded in blocks of at most `batch_lines` lines and about `block_chars` characters,
    which bounds the memory. `sources` ({name: [first line, end line)}, from the level's statistics) names the lines of each
    source; `caps` ({name: tokens}) stops taking a source's lines once it has given that many
    tokens (the line that reaches the cap is kept whole). Beside the array go its sha256 and, with
    `sources`, where each source's tokens lie."""
    if threads:
        os.environ["RAYON_NUM_THREADS"] = str(threads)  # read when tokenizers starts its thread pool
    eos = eos_id(tokenizer) if eos is None else int(eos)
    dtype = token_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
    ranges = sorted(((lo, hi, name) for name, (lo, hi) in (sources or {}).items() if hi > lo))
    caps = caps or {}
    out_file = Path(out_file)
    writer = NpyWriter(out_file, dtype)
    spans: dict[str, list[int]] = {}
    given: dict[str, int] = {}

    starts = [lo for lo, _, _ in ranges]

    def source_of(line_no: int) -> str | None:
        i = bisect.bisect_right(starts, line_no) - 1
        return ranges[i][2] if i >= 0 and line_no < ranges[i][1] else None

    try:
        line_no = 0
        with open(text_file, encoding="utf-8") as fh:
            for block in line_blocks(fh, max_lines=batch_lines, max_chars=block_chars):
                numbers = range(line_no, line_no + len(block))
                line_no += len(block)
                keep = [(n, ln) for n, ln in zip(numbers, block) if ln.strip()]
                if caps:  # a source already at its cap is not even encoded
                    keep = [(n, ln) for n, ln in keep if given.get(source_of(n), 0) < caps.get(source_of(n), 1 << 62)]
                if not keep:
                    continue
                ids, lengths = _encode_block(tokenizer, [ln for _, ln in keep], eos, dtype)
                if ranges:
                    ids, lengths = _apply_caps(keep, ids, lengths, source_of, caps, given, spans, writer.size)
                writer.write(ids)
    finally:
        writer.close()
    if writer.size == 0:
        out_file.unlink(missing_ok=True)
        raise GrowlmError(f"{text_file} has no sentences")
    record_sha256(out_file)
    if ranges:
        Path(f"{out_file}.sources.json").write_text(json.dumps(spans, indent=1))
    return writer.size


def _encode_block(tokenizer: Tokenizer, lines: list[str], eos: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """The ids of a block of units, EOS after each, and each unit's length. The block's Encoding
    objects (ids, offsets, token strings: about 100 bytes a token) die here, before the next block
    is encoded."""
    flat: list[int] = []
    counts: list[int] = []
    # encode_batch_fast: the same ids without the character offsets (+16% speed, measured)
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    for enc in encode(lines, add_special_tokens=False):
        unit = enc.ids
        flat += unit
        flat.append(eos)
        counts.append(len(unit) + 1)
    return np.array(flat, dtype=dtype), np.array(counts, dtype=np.int64)


def _apply_caps(keep, ids, lengths, source_of, caps, given, spans, offset):
    """Drop the lines of capped sources past their cap; extend each source's token span."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    take = np.ones(len(keep), dtype=bool)
    for i, (n, _) in enumerate(keep):
        name = source_of(n)
        if name is None:
            continue
        if name in caps and given.get(name, 0) >= caps[name]:
            take[i] = False
            continue
        given[name] = given.get(name, 0) + int(lengths[i])
    pieces, pos = [], offset
    for i, (n, _) in enumerate(keep):
        if not take[i]:
            continue
        name = source_of(n)
        if name is not None:
            span = spans.setdefault(name, [pos, pos])
            span[1] = pos + int(lengths[i])
        pieces.append(ids[starts[i]:ends[i]])
        pos += int(lengths[i])
    out = np.concatenate(pieces) if pieces else ids[:0]
    return out, lengths[take]


def concat_token_files(files: Iterable[str | Path], out_file: str | Path, *, block: int = 1 << 22) -> int:
    """One token file holding `files` one after another (a training set drawn from several
    levels), streamed; the sources' spans follow. Return its length."""
    files = [Path(f) for f in files]
    arrays = [load_tokens(f) for f in files]
    dtype = np.result_type(*(a.dtype for a in arrays))
    writer = NpyWriter(out_file, dtype)
    spans: dict[str, list[int]] = {}
    try:
        for f, arr in zip(files, arrays):
            offset = writer.size
            for name, (lo, hi) in token_sources(f).items():
                spans[name] = [lo + offset, hi + offset]
            for i in range(0, arr.size, block):
                writer.write(arr[i:i + block])
    finally:
        writer.close()
    record_sha256(out_file)
    Path(f"{out_file}.sources.json").write_text(json.dumps(spans, indent=1))
    return writer.size


def token_sources(path: str | Path) -> dict[str, list[int]]:
    """{source: [start, end)} of a token file's tokens, or {} when it has no such record."""
    record = Path(f"{path}.sources.json")
    return {k: list(v) for k, v in read_json(record).items()} if record.is_file() else {}


def load_tokens(path: str | Path) -> np.ndarray:
    """Memory-map a token file written by `encode_file`, checked against the sha256 it recorded."""
    path = Path(path)
    if not path.is_file():
        raise GrowlmError(f"token file {path} does not exist")
    try:
        arr = np.load(path, mmap_mode="r")
    except Exception as err:
        raise damaged(path, f"not a readable .npy token file: {err}") from None
    if arr.ndim != 1 or arr.dtype not in TOKEN_DTYPES:
        raise damaged(path, f"not a flat uint16 or uint32 array but {arr.dtype} of shape {arr.shape}")
    check_recorded_sha256(path)
    return arr


def book_clusters(sources: dict[str, list[int]], count: int) -> list[list[str]]:
    """The sources of a token file split into `count` disjoint clusters that together cover them,
    balanced by tokens: largest source first, each to the cluster with the fewest tokens so far
    (ties: the lower index). Deterministic: the same record gives the same clusters."""
    if len(sources) < count:
        raise GrowlmError(f"members.data: clusters needs at least {count} sources (books) at the members' levels to "
                          f"make {count} clusters by book, but the tokens have {len(sources)}: "
                          f"{', '.join(sources) or 'no record'}; lower members.shards or use data: shards")
    clusters: list[list[str]] = [[] for _ in range(count)]
    totals = [0] * count
    for name, (start, end) in sorted(sources.items(), key=lambda kv: (kv[1][0] - kv[1][1], kv[0])):
        k = min(range(count), key=lambda i: (totals[i], i))
        clusters[k].append(name)
        totals[k] += end - start
    return clusters


def cluster(tokens: np.ndarray, sources: dict[str, list[int]], index: int, count: int) -> np.ndarray:
    """The tokens of cluster `index` of `book_clusters(sources, count)`, in file order (a copy)."""
    if not 0 <= index < count:
        raise GrowlmError(f"cluster index {index} out of range for {count} clusters")
    names = set(book_clusters(sources, count)[index])
    spans = sorted(tuple(v) for k, v in sources.items() if k in names)
    return np.concatenate([np.asarray(tokens[a:b]) for a, b in spans])


def shard(tokens: np.ndarray, index: int, count: int) -> np.ndarray:
    """Contiguous shard `index` of `count` (members trained on disjoint data)."""
    if not 0 <= index < count:
        raise GrowlmError(f"shard index {index} out of range for {count} shards")
    size = tokens.size // count
    return tokens[index * size : (index + 1) * size]
