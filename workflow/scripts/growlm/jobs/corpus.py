"""Jobs of the corpus stage: download a source, prepare one source, build one reading level. No torch."""

from __future__ import annotations

import json
import time
from pathlib import Path

from growlm import corpus, prepare, sources
from growlm.errors import read_json, record_sha256
from growlm.console import log


def download_source(source: dict, out_file: str | Path) -> None:
    """Download a URL source to `out_file`, checked against its sha256; or copy it from the mirror
    folder ($GROWLM_MIRROR, which the config's corpus.mirror sets for the jobs), checked alike.

    Where the bytes come from is the machine's, not the experiment's: the mirror reaches the job through
    the environment, never the rule's params, so that pointing a run at a mirror (or away from one)
    reruns nothing: the sha256 makes both give the same file."""
    expected = source.get("sha256")
    if expected in (None, "skip"):  # refused by the config check unless the user said skip
        log(f"warning: source {source['name']} has sha256: skip; its download is not checked")
        expected = None
    mirror = sources.mirror_folder()
    corpus.download_source(source["url"], Path(out_file), expected, source["name"], mirror=mirror)
    found = mirror is not None and (mirror / f"{source['name']}.txt").is_file()
    origin = f"the mirror {mirror}" if found else source["url"]
    log(f"source {source['name']}: {Path(out_file).stat().st_size} bytes from {origin}")


def prepare_source(settings: dict, *, inputs: list[str], out_dir: str | Path, threads: int | None) -> None:
    """Read one source (`growlm.sources`), clean and cut it into units per split (`growlm.prepare`)
    and record what it read (`source.json`: provenance and counts)."""
    source, corpus_settings = settings["source"], settings["corpus"]
    how = sources.settings_of(source, corpus_settings)
    # a bundled book or a download is the one file the rule names; a `path` or `hf` source is read
    # from its own spec (a folder keeps its Hub card's configs and splits)
    location = inputs[0] if sources.kind(source) in ("bundled", "url") else None
    processes = prepare.processes_for(threads)
    start = time.perf_counter()
    counts = prepare.prepare_source(sources.documents(source, location, how), how, out_dir, processes=processes,
                                    name=source["name"])
    seconds = time.perf_counter() - start
    record = {**sources.provenance(source, location, how), **counts, "seconds": round(seconds, 3)}
    Path(out_dir, "source.json").write_text(json.dumps(record, indent=2))
    for written in sorted(Path(out_dir).iterdir()):  # known by content: a damaged one is named before any job
        if written.is_file() and written.suffix != ".sha256":
            record_sha256(written)
    log(f"source {source['name']} (level {source['level']}, clean: {how['clean']}, "
        f"{'sentences' if how['sentences'] else 'documents'}): {counts['documents']} documents -> "
        f"{counts['units']} units {counts['splits']} in {seconds:.1f} s with {processes} process(es)")


def build_level(level: str, names: list[str], source_dirs: list[str | Path], *, out_dir: str | Path,
                stats_file: str | Path) -> None:
    """Merge a level's prepared sources (`names`, in `source_dirs`) into its train/val/test files,
    without repeats."""
    dirs = [Path(d) for d in source_dirs]
    stats = prepare.build_level(level, list(zip(names, dirs)), out_dir)
    prepare.write_stats(stats, [read_json(d / "source.json") for d in dirs], stats_file)
    for split in ("train", "val", "test"):  # known by content (growlm.outputs.damaged_files)
        record_sha256(Path(out_dir) / f"{split}.txt")
    record_sha256(stats_file)
    summary = {k: stats[k] for k in ("sentences", "words", "mean_sentence_words", "flesch_kincaid_grade", "splits")}
    log(f"level {level}: {json.dumps(summary, default=float)}")
