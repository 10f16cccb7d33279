"""Corpus preparation that scales: a source's documents -> cleaned units per split, then a level.

Two steps, each streaming (memory bounded by a chunk, not by the corpus) and the first parallel:

`prepare_source` reads a source's documents in batches (`growlm.sources.documents`), cleans and
cuts each batch into *units* (sentences, or whole documents; `growlm.corpus.units`) in a pool of
worker processes, and writes one unit per line into ``train.txt`` / ``val.txt`` / ``test.txt``
(the split of a unit is a hash of its text alone: `growlm.corpus.split_of`), each beside a
``.keys`` file holding the first 16 bytes of every line's SHA-256 (16 bytes a line, raw) and a
``.counts`` file with its words and syllables (three int32 a line, `growlm.corpus.unit_counts`),
counted in the workers so that a level's statistics are sums. Batches
go to the workers through a bounded window (`ordered_map`) and come back in order, so the output
is the same for any number of processes.

`build_level` merges a level's sources, in the configured order, into the level's split files,
dropping every unit seen before (the first occurrence wins, as a set of sentences would) without a
set of the corpus in memory: the keys go into 64 bucket files by their leading bits, each bucket is
sorted on its own to find the repeats, and a bitmap (one bit a line) marks them for the final pass.
Two different units share a 128-bit key with probability about n^2 / 2^129 (1e-24 for 10^8 units).
The level's statistics are the sums of the kept lines' counts, and it records where each source's lines lie in each split (`lines`: [start, end)), for
`growlm.tokens.encode_file` to cap a source at its `max_tokens`.

Torch-free (the corpus jobs import no torch).
"""

from __future__ import annotations

import collections
import functools
import json
import multiprocessing
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from growlm import corpus
from growlm.errors import GrowlmError

SPLITS = corpus.SPLITS
KEY_BYTES = 16
_KEY_DTYPE = np.dtype([("hi", ">u8"), ("lo", ">u8")])
_BUCKET_DTYPE = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("idx", "<u8")])
_BUCKET_BITS = 6  # 64 buckets
_COUNT_DTYPE = np.dtype("<i4")  # per unit: alphabetic words, Flesch-Kincaid words, syllables


# ---------------------------------------------------------------------------------------------
# a bounded, ordered parallel map
# ---------------------------------------------------------------------------------------------


def ordered_map(fn: Callable, items: Iterable, processes: int, *, window: int | None = None) -> Iterator:
    """`map(fn, items)` over `processes` worker processes, results in input order, with at most
    `window` (default 2 x processes) items in flight: unlike `Pool.imap`, which reads its whole
    input ahead, this never holds more than a window of a streamed corpus. One process (or a
    single item) runs in this process, with no pool at all."""
    it = iter(items)
    first = next(it, _END)
    if first is _END:
        return
    second = next(it, _END)
    if processes <= 1 or second is _END:
        yield fn(first)
        if second is not _END:
            yield fn(second)
        for item in it:
            yield fn(item)
        return
    window = window or 2 * processes
    # forkserver, not fork: this process may hold threads (Arrow's, the tokenizers', a test runner's),
    # and a child forked from it can deadlock on a lock one of them held (seen under pytest-xdist).
    # The server is a clean process with this module preloaded; the workers are forked from it.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["growlm.prepare"])
    with ctx.Pool(processes) as pool:
        pending: collections.deque = collections.deque()
        for item in _chain(first, second, it):
            pending.append(pool.apply_async(fn, (item,)))
            if len(pending) >= window:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


_END = object()


def _chain(first, second, rest):
    yield first
    yield second
    yield from rest


# ---------------------------------------------------------------------------------------------
# one source
# ---------------------------------------------------------------------------------------------


def _units_by_split(docs: list[str], settings: dict) -> dict[str, tuple[list[str], bytes, bytes]]:
    """A worker's share: the units of a batch of documents by split, each with its key and its
    counts (`corpus.unit_counts`)."""
    out = {split: ([], [], []) for split in SPLITS}
    for doc in docs:
        for unit, unit_counts in corpus.counted_units(doc, settings):
            digest = corpus.unit_digest(unit)
            lines, keys, counts = out[corpus.split_of_digest(digest, settings["val_fraction"],
                                                             settings["test_fraction"])]
            lines.append(unit)
            keys.append(digest[:KEY_BYTES])
            counts.append(unit_counts)
    return {split: (lines, b"".join(keys), np.asarray(counts, dtype=_COUNT_DTYPE).reshape(-1, 3).tobytes())
            for split, (lines, keys, counts) in out.items()}


def prepare_source(batches: Iterable[list[str]], settings: dict, out_dir: str | Path, *, processes: int = 1,
                   name: str = "source") -> dict:
    """Clean a source's document batches into per-split unit files in `out_dir` (see the module
    docstring); return {"documents", "units", "splits": {split: units}}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = {split: open(out_dir / f"{split}.txt", "w", encoding="utf-8") for split in SPLITS}
    keys = {split: open(out_dir / f"{split}.keys", "wb") for split in SPLITS}
    unit_counts = {split: open(out_dir / f"{split}.counts", "wb") for split in SPLITS}
    counts = dict.fromkeys(SPLITS, 0)
    documents = 0

    def counted(batches):
        nonlocal documents
        for batch in batches:
            documents += len(batch)
            yield batch

    work = functools.partial(_units_by_split, settings=settings)
    try:
        for result in ordered_map(work, counted(batches), processes):
            for split, (lines, key_bytes, count_bytes) in result.items():
                if lines:
                    texts[split].write("".join(line + "\n" for line in lines))
                    keys[split].write(key_bytes)
                    unit_counts[split].write(count_bytes)
                    counts[split] += len(lines)
    finally:
        for fh in (*texts.values(), *keys.values(), *unit_counts.values()):
            fh.close()
    if documents == 0:
        raise GrowlmError(f"corpus source {name!r} has no text (no non-empty document was read)")
    if sum(counts.values()) == 0:
        raise GrowlmError(f"corpus source {name!r}: nothing is left after cleaning ({documents} documents read, "
                          f"clean: {settings['clean']}, min_words: {settings['min_words']}); try another `clean:`")
    return {"documents": documents, "units": sum(counts.values()), "splits": counts}


# ---------------------------------------------------------------------------------------------
# one level
# ---------------------------------------------------------------------------------------------


def _read_keys(path: Path, chunk: int) -> Iterator[np.ndarray]:
    size = path.stat().st_size
    if size % KEY_BYTES:
        raise GrowlmError(f"{path} is damaged (its size {size} is not a multiple of {KEY_BYTES})")
    with open(path, "rb") as fh:
        while block := fh.read(chunk * KEY_BYTES):
            yield np.frombuffer(block, dtype=_KEY_DTYPE)


def _repeats(key_files: list[Path], work_dir: Path, chunk: int) -> np.ndarray:
    """A bitmap (np.uint8, one bit a line, lines numbered across `key_files` in order) of the lines
    whose key appeared on an earlier line."""
    work_dir.mkdir(parents=True, exist_ok=True)
    buckets = [open(work_dir / f"{b:02d}.bin", "wb") for b in range(1 << _BUCKET_BITS)]
    n = 0
    try:
        for f in key_files:
            for keys in _read_keys(f, chunk):
                rec = np.empty(keys.size, dtype=_BUCKET_DTYPE)
                rec["hi"], rec["lo"] = keys["hi"], keys["lo"]
                rec["idx"] = np.arange(n, n + keys.size, dtype=np.uint64)
                n += keys.size
                which = (rec["hi"] >> np.uint64(64 - _BUCKET_BITS)).astype(np.int64)
                order = np.argsort(which, kind="stable")
                bounds = np.searchsorted(which[order], np.arange((1 << _BUCKET_BITS) + 1))
                for b in range(1 << _BUCKET_BITS):
                    if bounds[b + 1] > bounds[b]:
                        buckets[b].write(rec[order[bounds[b]:bounds[b + 1]]].tobytes())
    finally:
        for fh in buckets:
            fh.close()
    seen_before = np.zeros((n + 7) // 8, dtype=np.uint8)
    for b in range(1 << _BUCKET_BITS):
        path = work_dir / f"{b:02d}.bin"
        rec = np.fromfile(path, dtype=_BUCKET_DTYPE)
        path.unlink()
        if rec.size < 2:
            continue
        rec = rec[np.lexsort((rec["idx"], rec["lo"], rec["hi"]))]
        same = (rec["hi"][1:] == rec["hi"][:-1]) & (rec["lo"][1:] == rec["lo"][:-1])
        dup = rec["idx"][1:][same].astype(np.int64)
        np.bitwise_or.at(seen_before, dup >> 3, (1 << (dup & 7)).astype(np.uint8))
    shutil.rmtree(work_dir, ignore_errors=True)
    return seen_before


def _summary(sentences: int, sums: np.ndarray) -> dict:
    words, fk_words, syllables = (int(v) for v in sums)
    return {"sentences": sentences, "words": words,
            "mean_sentence_words": round(words / sentences, 3) if sentences else 0.0,
            "flesch_kincaid_grade": round(corpus.grade(sentences, fk_words, syllables), 3) if sentences else 0.0}


def build_level(level: str, sources: list[tuple[str, str | Path]], out_dir: str | Path, *,
                chunk: int = 1 << 16) -> dict:
    """Merge a level's prepared sources (name, folder) into ``out_dir/{train,val,test}.txt`` without
    repeats; return the level's statistics (see the module docstring)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = ", ".join(name for name, _ in sources) or "(no sources)"
    splits, lines_of, kept_of = {}, {name: {} for name, _ in sources}, dict.fromkeys((n for n, _ in sources), 0)
    total_units, total_sums = 0, np.zeros(3, dtype=np.int64)
    for split in SPLITS:
        repeats = _repeats([Path(d) / f"{split}.keys" for _, d in sources], out_dir / f".repeats-{split}", chunk)
        idx, written, sums = 0, 0, np.zeros(3, dtype=np.int64)
        with open(out_dir / f"{split}.txt", "w", encoding="utf-8") as out:
            for name, d in sources:
                start = written
                with open(Path(d) / f"{split}.txt", encoding="utf-8") as fh, \
                        open(Path(d) / f"{split}.counts", "rb") as counts_fh:
                    for block in corpus.line_blocks(fh, max_lines=chunk):
                        counts = np.frombuffer(counts_fh.read(len(block) * 3 * _COUNT_DTYPE.itemsize),
                                               dtype=_COUNT_DTYPE).reshape(-1, 3)
                        if len(counts) != len(block):
                            raise GrowlmError(f"{Path(d) / f'{split}.counts'} is damaged (fewer counts than lines); "
                                              f"rebuild it with `snakemake --forcerun prepare_source`")
                        keep = _bits(repeats, idx, len(block)) == 0
                        idx += len(block)
                        kept = [line for line, k in zip(block, keep) if k]
                        if kept:
                            out.write("".join(line + "\n" for line in kept))
                            sums += counts[keep].sum(axis=0)
                            written += len(kept)
                lines_of[name][split] = [start, written]
                kept_of[name] += written - start
        if idx * KEY_BYTES != sum((Path(d) / f"{split}.keys").stat().st_size for _, d in sources):
            raise GrowlmError(f"level {level}: the {split} lines and their keys disagree; rebuild the sources "
                              f"{names} (`snakemake --forcerun prepare_source`)")
        splits[split] = {"sentences": written, "words": int(sums[0])}
        total_units += written
        total_sums += sums
    if total_units == 0:
        raise GrowlmError(f"corpus level {level} with sources {names} has no sentences after cleaning")
    for split in SPLITS:
        if not splits[split]["sentences"]:
            raise GrowlmError(f"corpus level {level} with sources {names}: the {split} split is empty "
                              f"({total_units} sentences in all); add text or raise its fraction")
    return {"level": str(level), **_summary(total_units, total_sums), "splits": splits, "sources": kept_of,
            "lines": lines_of}


def _bits(bitmap: np.ndarray, start: int, count: int) -> np.ndarray:
    idx = np.arange(start, start + count)
    return (bitmap[idx >> 3] >> (idx & 7).astype(np.uint8)) & 1


def write_stats(stats: dict, provenance: list[dict], path: str | Path) -> None:
    """The level's statistics with each source's provenance (`growlm.sources.provenance`)."""
    stats = {**stats, "provenance": {p["name"]: p for p in provenance}}
    Path(path).write_text(json.dumps(stats, indent=2, default=float))


def processes_for(threads: int | None) -> int:
    """Worker processes for a job given `threads` cores (all usable cores when None)."""
    if threads:
        return max(1, int(threads))
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def prepare_level(sources: list[tuple[str, str]], out_dir: str | Path, *, val_fraction: float = 0.05,
                  test_fraction: float = 0.05, min_words: int = 3, max_words: int = 60, clean: str = "gutenberg",
                  sentences: bool = True, level: str = "0") -> dict:
    """One level from (name, raw text) pairs held in memory, through the same two steps as the
    workflow (for tests and quick experiments); returns `build_level`'s statistics."""
    corpus._check_fractions(val_fraction, test_fraction)
    settings = {"clean": clean, "sentences": sentences, "min_words": min_words, "max_words": max_words,
                "val_fraction": val_fraction, "test_fraction": test_fraction}
    out_dir = Path(out_dir)
    work = out_dir / ".sources"
    try:
        for name, text in sources:
            prepare_source([[text]], settings, work / name, name=name)
        return build_level(level, [(name, work / name) for name, _ in sources], out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
