"""Corpus preparation speed and memory: growlm's prepare -> level -> tokens against a plain encode.

A corpus of TinyStories-like documents is generated from the bundled readers (their sentences,
shuffled into stories of 5-25 sentences, each word order lightly permuted so that the stories do not
repeat; documents separated by `<|endoftext|>` lines), at two sizes (default 200 and 400 MB). Both
sides use one BPE fitted beforehand on 20 MB of it (vocab 4096, the default config's), so neither
pays for fitting. For each size, in a fresh process:

- growlm: the workflow's own functions, as its jobs call them, with `--cores` processes: read the
  file through `datasets.load_dataset` (streaming), clean it as documents (`clean: documents`),
  split it by hash into train/val/test with the 16-byte keys (`growlm.prepare.prepare_source`),
  merge it into a level without repeats (`build_level`), and encode every split to a token file
  (`growlm.tokens.encode_file`).
- the reference: one process reads the raw file line by line and calls `tokenizer.encode_batch` on
  blocks of 8192 lines (the tokenizers library itself uses every core), keeping only the count.

Each prints MB of raw text per second of wall time and its peak resident memory: the process's own,
and for growlm also the largest total of the process and its worker processes (sampled; shared pages
counted once per process, so an overstatement). The last line is
`prep_mb_per_s=<growlm at the largest size> reference_mb_per_s=... ratio=... peak_mb=<size:own/with workers,...>`.

    .venv/bin/python bench/prep.py                       # 200 and 400 MB, about 5 minutes on 2 cores
    .venv/bin/python bench/prep.py --sizes 20 40         # a quick run
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))


@functools.cache  # once a run: every bundled reader through pysbd is the costly part of generating
def bundled_sentences() -> list[str]:
    """The sentences of the default config's bundled readers, cleaned and split as the workflow does."""
    import yaml

    from growlm import corpus

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    sentences = []
    for s in config["corpus"]["sources"]:
        text = corpus.read_source(REPO / "workflow" / "resources" / "corpus" / s["bundled"])
        sentences += corpus.split_sentences(corpus.clean_gutenberg(text))
    return sentences


def generate(path: Path, megabytes: int, seed: int = 0) -> None:
    """Stories built from the bundled readers' sentences (see the module docstring)."""
    sentences = bundled_sentences()
    rng = random.Random(seed)
    target = megabytes * 1_000_000
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            story = []
            for sentence in rng.sample(sentences, rng.randint(5, 25)):
                words = sentence.split()
                if len(words) > 3:  # a light permutation: two inner words swap places
                    i, j = rng.sample(range(1, len(words) - 1), 2)
                    words[i], words[j] = words[j], words[i]
                story.append(" ".join(words))
            paragraph = rng.randint(2, 4)
            text = "\n".join(" ".join(story[k:k + paragraph]) for k in range(0, len(story), paragraph))
            block = text + "\n<|endoftext|>\n"
            out.write(block)
            written += len(block.encode("utf-8"))


def fit(sample: Path, out_dir: Path) -> None:
    from growlm.tokenizer import fit_tokenizer

    fit_tokenizer([str(sample)], out_dir, vocab_size=4096, min_frequency=2, max_length=128)


def run_growlm(raw: Path, tokenizer_dir: Path, work: Path, cores: int) -> dict:
    from growlm import prepare, sources
    from growlm.tokenizer import load_tokenizer
    from growlm.tokens import encode_file

    source = {"name": "stories", "level": "stories", "path": str(raw), "clean": "documents"}
    how = sources.settings_of(source, {"min_words": 3, "max_words": 60, "val_fraction": 0.05,
                                       "test_fraction": 0.05})
    tok = load_tokenizer(tokenizer_dir)
    times = {}
    t0 = time.perf_counter()
    counts = prepare.prepare_source(sources.documents(source, None, how), how, work / "source", processes=cores,
                                    name="stories")
    times["prepare_source"] = time.perf_counter() - t0
    t = time.perf_counter()
    stats = prepare.build_level("stories", [("stories", work / "source")], work / "level")
    times["build_level"] = time.perf_counter() - t
    t = time.perf_counter()
    tokens = 0
    for split in prepare.SPLITS:
        lines = {name: spans[split] for name, spans in stats["lines"].items()}
        tokens += encode_file(work / "level" / f"{split}.txt", tok, work / f"{split}.npy", sources=lines,
                              threads=cores)
    times["encode"] = time.perf_counter() - t
    times["total"] = time.perf_counter() - t0
    return {"times": times, "documents": counts["documents"], "units": stats["sentences"], "tokens": tokens}


def run_reference(raw: Path, tokenizer_dir: Path) -> dict:
    from growlm.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    t0 = time.perf_counter()
    tokens = 0
    with open(raw, encoding="utf-8") as fh:
        while True:
            block = [line for _, line in zip(range(8192), fh)]
            if not block:
                break
            tokens += sum(len(e.ids) for e in tok.encode_batch(block, add_special_tokens=False))
    return {"times": {"total": time.perf_counter() - t0}, "tokens": tokens}


class TreeMemory:
    """The resident memory of this process and of all its descendants (the preparation's worker
    processes), sampled every 0.2 s: the largest total seen. Pages the workers share with their
    parent count once per process, so this overstates what the machine needs."""

    def __init__(self):
        import threading

        import psutil

        self.me, self.peak, self.stop = psutil.Process(), 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            total = 0
            for p in [self.me, *self.me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except Exception:  # a worker that just ended
                    pass
            self.peak = max(self.peak, total)
            self.stop.wait(0.2)

    def close(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.peak / 2**20


def child(args) -> None:
    """One measurement in this fresh process; prints a JSON line."""
    raw, tok_dir, work = Path(args.raw), Path(args.tokenizer), Path(args.work)
    tree = TreeMemory()
    result = run_growlm(raw, tok_dir, work, args.cores) if args.side == "growlm" else run_reference(raw, tok_dir)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.update(peak_mb=round(own, 1), tree_peak_mb=round(tree.close(), 1), raw_mb=raw.stat().st_size / 1e6)
    print("RESULT " + json.dumps(result), flush=True)


def measure(side: str, raw: Path, tok_dir: Path, work: Path, cores: int) -> dict:
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow" / "scripts"), "HF_DATASETS_CACHE": str(work / "hf")}
    proc = subprocess.run([sys.executable, __file__, "--child", side, "--raw", str(raw), "--tokenizer", str(tok_dir),
                           "--work", str(work), "--cores", str(cores)], capture_output=True, text=True, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{side} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    shutil.rmtree(work, ignore_errors=True)
    return json.loads(line[7:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[200, 400], help="corpus sizes in MB")
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--sample-mb", type=int, default=20, help="text the shared tokenizer is fitted on")
    p.add_argument("--dir", default=str(REPO / "bench" / "run_prep"), help="where the generated corpora go")
    p.add_argument("--child", choices=["growlm", "reference"], help=argparse.SUPPRESS)
    p.add_argument("--raw", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.side = args.child
        return child(args)
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    sample, tok_dir = base / "sample.txt", base / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        generate(sample, args.sample_mb, seed=99)
        fit(sample, tok_dir)
    rows = []
    for size in args.sizes:
        raw = base / f"stories_{size}mb.txt"
        if not raw.is_file():
            t = time.perf_counter()
            generate(raw, size)
            print(f"generated {raw.name} in {time.perf_counter() - t:.0f} s", flush=True)
        ref = measure("reference", raw, tok_dir, base / "work", args.cores)
        ours = measure("growlm", raw, tok_dir, base / "work", args.cores)
        mb = ours["raw_mb"]
        row = {"size_mb": round(mb), "growlm_mb_per_s": mb / ours["times"]["total"],
               "reference_mb_per_s": mb / ref["times"]["total"], "growlm_peak_mb": ours["peak_mb"],
               "growlm_tree_peak_mb": ours["tree_peak_mb"], "reference_peak_mb": ref["peak_mb"],
               "stages_s": {k: round(v, 1) for k, v in ours["times"].items()}, "units": ours["units"],
               "tokens": ours["tokens"]}
        row["ratio"] = row["growlm_mb_per_s"] / row["reference_mb_per_s"]
        rows.append(row)
        print(f"{row['size_mb']:>5} MB  growlm {row['growlm_mb_per_s']:.2f} MB/s (stages {row['stages_s']}), "
              f"peak {row['growlm_peak_mb']:.0f} MB (with its workers {row['growlm_tree_peak_mb']:.0f} MB)  |  "
              f"reference {row['reference_mb_per_s']:.2f} MB/s, peak {row['reference_peak_mb']:.0f} MB  |  "
              f"ratio {row['ratio']:.2f}  ({row['units']} units, {row['tokens']} tokens)", flush=True)
    last = rows[-1]
    peaks = ",".join(f"{r['size_mb']}:{r['growlm_peak_mb']:.0f}/{r['growlm_tree_peak_mb']:.0f}" for r in rows)
    print(f"prep_mb_per_s={last['growlm_mb_per_s']:.2f} reference_mb_per_s={last['reference_mb_per_s']:.2f} "
          f"ratio={last['ratio']:.2f} peak_mb={peaks} cores={args.cores}")


if __name__ == "__main__":
    main()
