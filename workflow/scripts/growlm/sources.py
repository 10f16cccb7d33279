"""Where a corpus source's documents come from: every kind is read with `datasets.load_dataset`.

A source is one entry of `corpus.sources`: a `name`, a `level` and where its text is:

    bundled: a book shipped in workflow/resources/corpus/ (plain text)
    url:     a plain-text file, downloaded and checked against `sha256` (rule download_source)
    path:    your own data: a file (.txt, .jsonl, .json, .parquet, .csv, optionally .gz/.bz2/.xz/.zst),
             a folder of such files, a dataset folder in the Hub's layout (a README.md card whose
             `configs` name the data files), or a glob
    hf:      a Hugging Face Hub dataset id, with `config`, `split` and `revision`

Whatever the kind, the text goes through one `datasets.load_dataset` call (the library knows the
formats, the Hub, revisions, caching and streaming); a local folder in the Hub's layout takes the
very call a Hub id takes. Rows are read in Arrow batches (`with_format("arrow")`: ten times faster
than Python dicts, measured) and streamed by default, so a source larger than memory is never held
whole. What a source yields is a stream of *documents* (strings):

- a row's `column` (default "text") for structured data and the Hub;
- for a plain-text file cleaned as a Gutenberg book (`clean: gutenberg`), the whole file;
- otherwise its lines, grouped into documents at `separator` lines (default `<|endoftext|>`, the
  TinyStories/GPT-2 convention; `blank` for blank lines; `line` when every line is a document, as in
  BabyLM's files). A separator inside a row splits it too.

`max_rows` stops reading after that many rows (documents, for a plain-text file), so a capped
source costs only what it reads. `provenance` records what was read: the Hub commit a revision
resolved to, or each local file's size and sha256, for the corpus output to name its data.

Torch-free and Snakemake-free; the Snakefile imports the cheap helpers (`local_files`,
`default_clean`) without importing `datasets`, which only the preparing job loads.
"""

from __future__ import annotations

import glob as globlib
import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

from huggingface_hub import HfApi, constants
from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

from growlm.errors import GrowlmError, sha256
from growlm.hub import PREPARE, unreachable

# datasets' packaged builders by file suffix (after any compression suffix)
BUILDERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv",
            ".train": "text", ".dev": "text", ".test": "text"}  # the last three: BabyLM's plain-text files
COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".zstd", ".lz4")
CLEAN_MODES = ("gutenberg", "documents", "none")
DEFAULT_SEPARATOR = "<|endoftext|>"
HUB_CARD = "README.md"
_BATCH_ROWS = 4096  # rows of data (a row may be a whole book)
_LINE_BATCH = 8192  # lines of a plain-text file (fewer than one of datasets' 10 MB reads holds)


MIRROR_ENV = "GROWLM_MIRROR"  # a folder holding downloads already (the Snakefile sets it from corpus.mirror)


def mirror_folder(setting: str | Path | None = None) -> Path | None:
    """The mirror downloads are looked up in: `setting` (the config's `corpus.mirror`), else
    $GROWLM_MIRROR, else None. A mirror that is not a folder is refused, naming where it was set."""
    where, value = ("corpus.mirror", setting) if setting else (f"${MIRROR_ENV}", os.environ.get(MIRROR_ENV))
    if not value:
        return None
    if not Path(value).is_dir():
        raise GrowlmError(f"{where} = {value}: no such folder (the mirror holds each download as <source name>.txt)")
    return Path(value)


def kind(source: dict) -> str:
    """"bundled", "url", "path" or "hf": where the source's text lives."""
    for key in ("bundled", "url", "path", "hf"):
        if source.get(key):
            return key
    raise GrowlmError(f"corpus source {source.get('name')!r} names none of bundled, url, path, hf")


def builder_of(path: str | Path) -> str | None:
    """The packaged `datasets` builder for a data file ("text", "json", "parquet", "csv"), or None."""
    name = str(path).lower()
    for ext in COMPRESSION:
        if name.endswith(ext):
            name = name[: -len(ext)]
    return BUILDERS.get(os.path.splitext(name)[1])


def is_hub_folder(path: str | Path) -> bool:
    """A dataset folder in the Hub's layout: a README.md card beside the data."""
    return Path(path).is_dir() and (Path(path) / HUB_CARD).is_file()


def local_files(spec: str) -> list[Path]:
    """The data files a `path:` source names (a file, a folder searched recursively, or a glob), in
    a stable order; the Hub card of a dataset folder is not data. Empty when nothing matches."""
    if any(ch in spec for ch in "*?["):
        found = [Path(p) for p in globlib.glob(spec, recursive=True)]
    elif Path(spec).is_dir():
        found = [p for p in Path(spec).rglob("*") if not any(part.startswith(".") for part in p.parts)]
    else:
        found = [Path(spec)] if Path(spec).exists() else []
    return sorted(p for p in found if p.is_file() and builder_of(p) and not (p.name == HUB_CARD and p.parent.is_dir()
                                                                               and is_hub_folder(p.parent)))


def is_plain_text(source: dict, files: list[Path] | None = None) -> bool:
    """Whether the source is plain text (a book or a text file), not rows with a column."""
    k = kind(source)
    if k in ("bundled", "url"):
        return True
    if k == "hf":
        return False
    if is_hub_folder(source["path"]):
        return False
    files = local_files(source["path"]) if files is None else files
    return bool(files) and all(builder_of(f) == "text" for f in files)


def default_clean(source: dict) -> str:
    """The cleaner a source gets when it names none: the Gutenberg cleaner for books (bundled, a URL,
    or your own plain-text file, as before named cleaners existed); `documents` for rows of data."""
    if source.get("clean"):
        return source["clean"]
    return "gutenberg" if is_plain_text(source) else "documents"


def settings_of(source: dict, corpus: dict) -> dict:
    """The reading and cleaning settings of one source: its own keys over the corpus defaults."""
    clean = default_clean(source)
    return {
        "clean": clean,
        "column": source.get("column", "text"),
        "separator": source.get("separator", DEFAULT_SEPARATOR),
        "sentences": bool(source.get("sentences", clean == "gutenberg")),
        "max_rows": source.get("max_rows"),
        "streaming": bool(source.get("streaming", True)),
        "min_words": int(corpus["min_words"]),
        "max_words": int(corpus["max_words"]),
        "val_fraction": float(corpus["val_fraction"]),
        "test_fraction": float(corpus["test_fraction"]),
    }


def hub_problem(source: dict) -> str | None:
    """Why the Hub dataset of an `hf:` source cannot be read now, or None: asked of the Hub itself
    (one request, ten seconds at most), so that a wrong id, a wrong revision or a machine without a
    network stops the run before any job instead of a job retrying for half a minute. A source read
    without streaming (`streaming: false`) that is in the local cache needs no network."""
    repo, revision = source["hf"], source.get("revision")
    reason = unreachable()  # HF_HUB_OFFLINE, or one short request that failed (growlm.hub)
    if reason is None:
        try:
            HfApi().dataset_info(repo, revision=revision, timeout=10)
            return None
        except RevisionNotFoundError:
            return f"the Hub dataset {repo!r} has no revision {revision!r}"
        except RepositoryNotFoundError:
            return (f"the Hub has no dataset {repo!r} (or it is private: log in with `hf auth login`); check the id "
                    f"on huggingface.co/datasets")
        except Exception as err:  # noqa: BLE001 - no network, a proxy, a time-out: all mean "cannot reach it"
            first = (str(err).strip().splitlines() or [""])[0]
            reason = f"the Hugging Face Hub cannot be reached ({type(err).__name__}: {first})"
    cached = Path(constants.HF_HUB_CACHE) / f"datasets--{repo.replace('/', '--')}"
    if source.get("streaming") is False and cached.is_dir():
        return None
    how = ("a streamed source is read from the Hub" if source.get("streaming", True) else
           f"the dataset is not in the local cache ({cached})")
    return (f"hf {repo!r}: {reason}, and {how}; prepare it where there is a network with `{PREPARE}` (and the same "
            f"--configfile), or download it and give its folder as path")


# ---------------------------------------------------------------------------------------------
# reading (imports datasets)
# ---------------------------------------------------------------------------------------------


def _load(source: dict, location: str | None, settings: dict):
    """The one `load_dataset` call: (dataset, column, plain_text)."""
    # Arrow's default allocator (mimalloc) keeps what a stream of batches freed: the peak memory of
    # reading grew with the file (+0.5 MB a MB, measured); the system allocator's stays flat
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    from datasets import load_dataset  # keeps datasets out of the Snakefile's parse

    k = kind(source)
    streaming = settings["streaming"]
    try:
        if k == "hf":
            ds = load_dataset(source["hf"], source.get("config"), split=source.get("split", "train"),
                              revision=source.get("revision"), streaming=streaming)
            return ds, settings["column"], False
        target = location if location is not None else source["path"]
        if k == "path" and is_hub_folder(target):
            ds = load_dataset(str(target), source.get("config"), split=source.get("split", "train"),
                              streaming=streaming)
            return ds, settings["column"], False
        files = [str(f) for f in (local_files(target) if k == "path" else [Path(target)])]
        if not files:
            raise GrowlmError(f"corpus source {source['name']!r}: no data file at {target!r}")
        builders = {builder_of(f) or "text" for f in files}
        if len(builders) > 1:
            raise GrowlmError(f"corpus source {source['name']!r}: {target!r} mixes formats "
                              f"({', '.join(sorted(builders))}); name one kind of file per source")
        builder = builders.pop()
        if builder == "text":
            by = "document" if settings["clean"] == "gutenberg" else "line"
            ds = load_dataset("text", data_files=files, split="train", sample_by=by, streaming=streaming)
            return ds, "text", True
        ds = load_dataset(builder, data_files=files, split="train", streaming=streaming)
        return ds, settings["column"], False
    except GrowlmError:
        raise
    except Exception as err:  # datasets' own errors: a missing Hub id, a bad split, a broken file
        where = source.get("hf") or location or source.get("path")
        raise GrowlmError(f"corpus source {source['name']!r}: datasets could not load {where!r}: "
                          f"{type(err).__name__}: {err}") from None


def _check_column(ds, column: str, name: str) -> None:
    features = getattr(ds, "features", None) or getattr(ds, "column_names", None)
    if features is not None and column not in features:
        raise GrowlmError(f"corpus source {name!r}: no column {column!r} (columns: {', '.join(features)}); set "
                          f"`column:` in the source")


def _arrow_batches(ds, column: str, name: str, rows: int):
    _check_column(ds, column, name)
    for table in ds.with_format("arrow").iter(batch_size=rows):
        if column not in table.column_names:
            raise GrowlmError(f"corpus source {name!r}: no column {column!r} (columns: "
                              f"{', '.join(table.column_names)}); set `column:` in the source")
        yield table.column(column)


def _column_batches(ds, column: str, name: str) -> Iterator[list]:
    for values in _arrow_batches(ds, column, name, _BATCH_ROWS):
        yield values.to_pylist()


def _text_chunks(ds, name: str) -> Iterator[str]:
    """A plain-text file read as lines, back as text: each Arrow batch of lines joined by Arrow
    itself (no Python string per line), every line ending in a newline."""
    import pyarrow as pa  # comes with datasets; keeps datasets out of the Snakefile's parse
    import pyarrow.compute as pc  # keeps datasets out of the Snakefile's parse

    for column in _arrow_batches(ds, "text", name, _LINE_BATCH):
        lines = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if len(lines):
            joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines), "\n")
            yield joined[0].as_py() + "\n"


_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n)+")


def _plain_documents(chunks: Iterator[str], separator: str) -> Iterator[str]:
    """Documents of a plain-text file: the text between separators (a `separator` string, inside a
    line or on its own; `blank`: one or more blank lines; `line`: every line), each stripped of the
    line breaks around it. A document may straddle chunks: the text after a chunk's last separator
    waits for the next chunk."""
    carry = ""
    for chunk in chunks:
        text = carry + chunk
        if separator == "line":
            docs = text.split("\n")
        elif separator == "blank":
            docs = _BLANK_LINES.split(text)
        else:
            docs = text.split(separator)
        carry = docs.pop()
        for doc in docs:
            doc = doc.strip("\r\n")
            if doc.strip():
                yield doc
    carry = carry.strip("\r\n")
    if carry.strip():
        yield carry


def _row_documents(texts_batches: Iterator[list], separator: str, plain: bool, limit: int | None) -> Iterator[str]:
    """Documents of rows: each row's text (split at separators inside it), up to `limit` rows."""
    rows = 0
    for texts in texts_batches:
        for text in texts:
            if limit is not None and rows >= limit:
                return
            rows += 1
            if text:
                yield from ([str(text)] if plain else _split_at(str(text), separator))


def _split_at(text: str, separator: str) -> list[str]:
    if separator in ("blank", "line") or not separator or separator not in text:
        return [text]
    return text.split(separator)


def documents(source: dict, location: str | None, settings: dict, *, batch_chars: int = 1 << 20) -> Iterator[list[str]]:
    """The source's non-blank documents, in batches of about `batch_chars` characters (see the
    module docstring). `location` is the local file the workflow resolved (a bundled book, a
    download), or None to read the source's own `path` or `hf`."""
    ds, column, plain = _load(source, location, settings)
    separator, limit = settings["separator"], settings["max_rows"]
    if plain and settings["clean"] != "gutenberg":
        docs = _plain_documents(_text_chunks(ds, source["name"]), separator)
        if limit is not None:
            docs = itertools.islice(docs, int(limit))
    else:
        docs = _row_documents(_column_batches(ds, column, source["name"]), separator, plain, limit)
    batch, size = [], 0
    for doc in docs:
        if not doc.strip():
            continue
        batch.append(doc)
        size += len(doc)
        if size >= batch_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def provenance(source: dict, location: str | None, settings: dict) -> dict:
    """What the source's data was exactly: the Hub commit its revision resolved to, or each local
    file's size and sha256 (recorded beside the prepared text, shown in the report)."""
    k = kind(source)
    record = {"name": source["name"], "level": str(source["level"]), "kind": k, "clean": settings["clean"],
              "sentences": settings["sentences"], "max_rows": settings["max_rows"]}
    if k == "hf":
        from datasets import load_dataset_builder  # keeps datasets out of the Snakefile's parse

        record.update({"hf": source["hf"], "config": source.get("config"), "split": source.get("split", "train"),
                       "revision": source.get("revision")})
        if Path(source["hf"]).is_dir():  # a local folder in the Hub's layout
            record["files"] = _file_records(local_files(source["hf"]))
        else:
            try:
                builder = load_dataset_builder(source["hf"], source.get("config"), revision=source.get("revision"))
                record["resolved_revision"] = builder.hash
            except Exception as err:  # the data itself loaded; say why the commit is unknown
                record["resolved_revision"] = None
                record["resolved_revision_error"] = f"{type(err).__name__}: {err}"
        return record
    if k == "url":
        record.update({"url": source["url"], "sha256_expected": source.get("sha256")})
    files = [Path(location)] if location is not None and k != "path" else local_files(source.get("path", ""))
    record["files"] = _file_records(files)
    return record


def _file_records(files: list[Path]) -> list[dict]:
    return [{"path": str(f), "bytes": f.stat().st_size, "sha256": sha256(f)} for f in files]
