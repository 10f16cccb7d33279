"""The overlay config/children-large.yaml, written from a folder of GITenberg books and its manifest.

The large corpus is several hundred public-domain children's books of Project Gutenberg in GITenberg's
copies: each book's raw file at a pinned commit of its GITenberg repository. The overlay lists every book
as a `url` + `sha256` source, so a run downloads exactly those bytes (or finds them in a mirror folder,
`corpus.mirror` or $GROWLM_MIRROR, checked by the same sha256); the books are not in the repository.

A book's level is its reading difficulty as growlm measures it: `growlm.corpus.reading_grade`, the
Flesch-Kincaid grade of the sentences the book contributes to the corpus (the Gutenberg cleaner, sentences
of `corpus.min_words` to `corpus.max_words` words: the schema's defaults, which the overlay keeps). A book of
grade at most `LEVEL0_MAX_GRADE` is level 0 (the members' text), every other book level 1 (the large
models'). The manifest's own `fk_grade` (another syllable counter, computed on the raw text) is not read.
The threshold is a fixed number, not a quantile, so that a book's level depends on its text alone: 5.2 is
about the median growlm grade of the 326 books (5.18), which halves them: 165 books at level 0, 161 at level 1
(docs/corpus.md gives each level's tokens). growlm's grades run higher than the manifest's (median 4.38):
pyphen's dictionary finds more syllables than a vowel-group count.

The manifest is a CSV with the columns pg_id, title, author, sha256, raw_url and converted (the layout of
GITenberg manifests gathered for growlm; the folder holds each book as pg<id>.txt). A book whose local file
was converted from Latin-1 (`converted` = yes) is left out: its raw_url serves the Latin-1 original,
whose sha256 is not the local file's, so a download and the mirror would not give the same bytes.

    .venv/bin/python bench/children_large.py BOOKS_FOLDER            # writes config/children-large.yaml
    .venv/bin/python bench/children_large.py BOOKS_FOLDER --check    # compares instead (exit 1 if it differs)

Grading the 326 books took 15 minutes on 2 busy shared cores (`--processes 2`; about 4 minutes of one idle
core's time). `--measure WORK` builds the overlay's levels from the folder instead, as the workflow's jobs
would, and prints each level's tokens and the passes over level 1 that models of each width make:

    .venv/bin/python bench/children_large.py BOOKS_FOLDER --measure /tmp/children-large --processes 2
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

from growlm import corpus, sources  # noqa: E402 (after the path above)
from growlm.errors import GrowlmError  # noqa: E402
from growlm.train_config import SCHEMA  # noqa: E402

OVERLAY = REPO / "config" / "children-large.yaml"
LEVEL0_MAX_GRADE = 5.2  # growlm's Flesch-Kincaid grade of a level-0 (easy) book: at most this
PINNED_URL = re.compile(r"^https://raw\.githubusercontent\.com/GITenberg/[^/]+/[0-9a-f]{40}/.+$")
_COMMENT_GRADE = re.compile(r"# grade (-?[0-9.]+)")


def corpus_defaults() -> dict:
    """The `corpus` settings a source is cleaned with when the config sets none: the schema's defaults."""
    props = yaml.safe_load(SCHEMA.read_text())["properties"]["corpus"]["properties"]
    return {key: sub["default"] for key, sub in props.items() if isinstance(sub, dict) and "default" in sub}


def level_of(grade: float, threshold: float = LEVEL0_MAX_GRADE) -> int:
    """The rule: level 0 for a book of grade at most `threshold`, else level 1."""
    return 0 if grade <= threshold else 1


def source_name(pg_id: str) -> str:
    """A book's source name, `pg<id>`: also its file name in a mirror folder (`pg<id>.txt`)."""
    return f"pg{int(pg_id)}"


def book_grade(path: str | Path) -> float:
    """`growlm.corpus.reading_grade` of a book file, cleaned as a `url` source of the overlay is."""
    source = {"name": Path(path).stem, "level": 0, "url": Path(path).as_uri()}
    return corpus.reading_grade(corpus.read_source(path), sources.settings_of(source, corpus_defaults()))


def read_manifest(manifest: Path) -> list[dict]:
    with manifest.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def books(folder: Path, manifest: Path | None = None, *, processes: int = 1,
          threshold: float = LEVEL0_MAX_GRADE) -> tuple[list[dict], list[dict]]:
    """(the overlay's books, the books left out): each book's file is checked against the manifest's
    sha256 and URL before it is graded, so the grade is of the bytes the overlay's URL gives."""
    rows = read_manifest(manifest or folder / "manifest.csv")
    kept, left_out = [], []
    for row in rows:
        if row.get("converted", "no").strip().lower() == "yes":
            left_out.append({**row, "why": "converted from Latin-1: its URL serves other bytes than its sha256's"})
            continue
        path = folder / f"{source_name(row['pg_id'])}.txt"
        if not path.is_file():
            raise GrowlmError(f"book pg{row['pg_id']} ({row['title']}): no file {path}")
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != row["sha256"]:
            raise GrowlmError(f"book pg{row['pg_id']} ({row['title']}): {path} has sha256 {actual}, the manifest "
                              f"says {row['sha256']}")
        kept.append({**row, "path": path})
    with ProcessPoolExecutor(processes) as pool:
        grades = list(pool.map(book_grade, [b["path"] for b in kept], chunksize=4))
    for book, g in zip(kept, grades):
        book["grade"], book["level"] = round(g, 2), level_of(round(g, 2), threshold)
    return kept, left_out


def _flow(value: str) -> str:
    return value if re.fullmatch(r"[A-Za-z0-9_./:+-]+", value) else yaml.safe_dump(value, width=10**6).strip()


def render(kept: list[dict], left_out: list[dict], threshold: float = LEVEL0_MAX_GRADE) -> str:
    """The overlay's text: a header saying what it is and how it was made, then one line per book with
    its grade and title in a comment (what tests/test_children_large.py reads back)."""
    n0 = sum(1 for b in kept if b["level"] == 0)
    lines = [
        "# Overlay: several hundred public-domain children's books from Project Gutenberg (GITenberg's copies,",
        "# each at a pinned commit), downloaded and checked against their sha256. Written by",
        "# bench/children_large.py from the books and their manifest; do not edit by hand.",
        "#",
        "#   .venv/bin/snakemake --cores 2 --configfile config/children-large.yaml",
        "#   GROWLM_MIRROR=/path/to/books .venv/bin/snakemake --cores 2 --configfile config/children-large.yaml",
        "#",
        "# The second reads each book from a local folder holding pg<id>.txt (corpus.mirror in a config does",
        "# the same), checked by the same sha256: no network needed. A book's level is growlm's own",
        "# Flesch-Kincaid grade of its sentences (growlm.corpus.reading_grade): level 0 at most "
        f"{threshold}, level 1 above",
        f"# ({n0} and {len(kept) - n0} books). Sizes in tokens, and where a text is seen once: docs/corpus.md.",
    ]
    if left_out:
        lines.append("# Left out: " + "; ".join(f"pg{b['pg_id']} ({b['why']})" for b in left_out) + ".")
    lines += ["experiment: children-large", "levels: {members: [0], large: [1]}", "corpus:", "  sources:"]
    for b in sorted(kept, key=lambda b: (b["level"], int(b["pg_id"]))):
        title = re.sub(r"\s+", " ", b["title"]).strip()
        author = re.sub(r"\s+", " ", b.get("author") or "").strip()
        who = f" ({author.split(',')[0]})" if author else ""
        lines.append(f"    - {{name: {source_name(b['pg_id'])}, level: {b['level']}, url: {_flow(b['raw_url'])}, "
                     f"sha256: {b['sha256']}}}  # grade {b['grade']:.2f}: {title[:70]}{who}")
    return "\n".join(lines) + "\n"


def recorded_grades(text: str) -> dict[str, float]:
    """{source name: grade} from the comments of an overlay `render` wrote."""
    out = {}
    for line in text.splitlines():
        if (name := re.search(r"\{name: ([A-Za-z0-9_.-]+),", line)) and (g := _COMMENT_GRADE.search(line)):
            out[name.group(1)] = float(g.group(1))
    return out


def schema_defaults(section: str) -> dict:
    props = yaml.safe_load(SCHEMA.read_text())["properties"][section]["properties"]
    return {key: sub["default"] for key, sub in props.items() if isinstance(sub, dict) and "default" in sub}


def measure(overlay: Path, mirror: Path, work: Path, *, processes: int = 1) -> list[dict]:
    """Each level of `overlay` built as the workflow's jobs build it (`growlm.jobs.corpus`, `growlm.jobs.tokenizer`,
    called in this process: one Python start instead of one per book) from the books in `mirror`, with the
    schema's default corpus, tokenizer and context settings: one row per level with its books, bytes, sentences,
    words, Flesch-Kincaid grade and tokens per split."""
    import os

    from growlm.jobs import corpus as corpus_jobs, tokenizer as tokenizer_jobs
    from growlm.tokens import load_tokens

    os.environ[sources.MIRROR_ENV] = str(mirror)  # what corpus.mirror does for the workflow's jobs
    books_ = yaml.safe_load(overlay.read_text())["corpus"]["sources"]
    settings = {k: v for k, v in corpus_defaults().items() if k in ("val_fraction", "test_fraction", "min_words",
                                                                     "max_words")}
    for b in books_:
        download = work / "downloads" / f"{b['name']}.txt"
        if not (work / "sources" / b["name"] / "source.json").is_file():
            corpus_jobs.download_source(b, download)
            corpus_jobs.prepare_source({"source": b, "corpus": settings}, inputs=[str(download)],
                                       out_dir=work / "sources" / b["name"], threads=processes)
    levels = sorted({str(b["level"]) for b in books_})
    stats = {}
    for level in levels:
        names = [b["name"] for b in books_ if str(b["level"]) == level]
        corpus_jobs.build_level(level, names, [work / "sources" / n for n in names], out_dir=work / f"level{level}",
                                stats_file=work / f"level{level}" / "stats.json")
        stats[level] = (names, json.loads((work / f"level{level}" / "stats.json").read_text()))
    tok = schema_defaults("tokenizer")
    tokenizer_jobs.fit_tokenizer([str(work / f"level{lv}" / "train.txt") for lv in levels], work / "tokenizer",
                                 vocab_size=tok["vocab_size"], min_frequency=tok["min_frequency"],
                                 max_length=schema_defaults("model")["context"])
    rows = []
    for level in levels:
        names, st = stats[level]
        row = {"level": level, "books": len(names),
               "bytes": sum((work / "downloads" / f"{n}.txt").stat().st_size for n in names),
               "sentences": st["sentences"], "words": st["words"], "grade": round(st["flesch_kincaid_grade"], 2)}
        for split in corpus.SPLITS:
            out = work / "tokens" / f"level{level}" / f"{split}.npy"
            tokenizer_jobs.encode_split(work / f"level{level}" / f"{split}.txt", work / "tokenizer", out,
                                        stats_file=work / f"level{level}" / "stats.json", split=split,
                                        threads=processes)
            row[f"{split}_tokens"] = len(load_tokens(out))
        rows.append(row)
    return rows


def seen_once(train_tokens: int, widths=(64, 96, 128, 192, 256), depth: int = 4,
              ratios=(8, 20)) -> list[dict]:
    """For GPT-2 models of the default experiment's settings (head size, context, tied embeddings, the
    default vocabulary) at `depth` and each width: their non-embedding parameters N (Kaplan et al.'s
    count, growlm.shape), and the passes over `train_tokens` that a budget of r N tokens makes."""
    from growlm.shape import ModelShape

    model, vocab = schema_defaults("model"), schema_defaults("tokenizer")["vocab_size"]
    out = []
    for d in widths:
        shape = ModelShape(n_embd=d, n_layer=depth, n_head=d // model["head_dim"], vocab_size=vocab,
                           n_positions=model["context"], tie_word_embeddings=model["tie_embeddings"])
        n = shape.n_params - shape.embedding_params
        out.append({"d1": d, "L1": depth, "non_embedding": n,
                    **{f"passes_at_{r}": round(r * n / train_tokens, 2) for r in ratios}})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="the books (pg<id>.txt) and their manifest.csv")
    ap.add_argument("--manifest", type=Path, help="the manifest (default FOLDER/manifest.csv)")
    ap.add_argument("--out", type=Path, default=OVERLAY)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    ap.add_argument("--measure", type=Path, metavar="WORK",
                    help="instead: build the overlay's levels from FOLDER (as a mirror) in WORK and print their tokens")
    args = ap.parse_args(argv)
    if args.measure:
        rows = measure(args.out, args.folder, args.measure, processes=args.processes)
        for row in rows:
            print(json.dumps(row))
        level1 = next(r for r in rows if r["level"] == "1")
        for row in seen_once(level1["train_tokens"]):
            print(json.dumps(row))
        return 0
    try:
        kept, left_out = books(args.folder, args.manifest, processes=args.processes)
    except GrowlmError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    text = render(kept, left_out)
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'as rendered' if same else 'differs from its render: run without --check'}")
        return 0 if same else 1
    args.out.write_text(text)
    n0 = sum(1 for b in kept if b["level"] == 0)
    print(f"{args.out}: {len(kept)} books, {n0} at level 0 (grade <= {LEVEL0_MAX_GRADE}), {len(kept) - n0} at "
          f"level 1; left out {len(left_out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
