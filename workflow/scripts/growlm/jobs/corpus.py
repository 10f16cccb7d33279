"""Jobs of the corpus stage: fetch a source, clean and split one reading level. No torch."""

from __future__ import annotations

import json
from pathlib import Path

from growlm import corpus
from growlm.jobs.common import log


def fetch_source(source: dict, out_file: str | Path, *, bundled: str | None = None) -> None:
    """Copy a bundled source or download it (sha256-checked) to `out_file`."""
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    if bundled:
        text = corpus.read_source(bundled)
        out_file.write_text(text, encoding="utf-8")
    else:
        if not source.get("sha256"):
            log(f"warning: source {source['name']} has no sha256; its download is not checked")
        corpus.download_source(source["url"], out_file, source.get("sha256"), source["name"])
    log(f"source {source['name']} (level {source['level']}): {out_file.stat().st_size} bytes")


def clean_level(source_files: list[str], names: list[str], level: int, out_dir: str | Path,
                stats_file: str | Path, settings: dict) -> None:
    """Clean, split into sentences and into train/val/test the sources of one level."""
    sources = [(name, Path(f).read_text(encoding="utf-8")) for name, f in zip(names, source_files)]
    stats = corpus.prepare_level(
        sources, Path(out_dir), val_fraction=settings["val_fraction"], test_fraction=settings["test_fraction"],
        min_words=settings["min_words"], max_words=settings["max_words"])
    stats = {"level": level, **stats}
    Path(stats_file).write_text(json.dumps(stats, indent=2, default=float))
    log(f"level {level}: {json.dumps(stats, default=float)}")
