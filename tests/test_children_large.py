"""The large corpus (config/children-large.yaml): books listed as `url` + `sha256` sources, levelled by
growlm's own reading grade (bench/children_large.py), and a mirror folder (`corpus.mirror`,
$GROWLM_MIRROR) that builds the very token files the URLs build.

The books themselves are not in the repository: the round trip serves three small bundled books from
127.0.0.1 (a thread running http.server, stopped before the mirror's build, so that build can reach no
URL), writes their overlay with the generator, and runs the corpus jobs (`growlm.jobs.corpus`,
`growlm.jobs.tokenizer`) in this process, as the workflow's jobs call them, once from the URLs and once
from the mirror. The committed overlay's grades are recomputed from the books where a mirror of them is
at hand ($GROWLM_MIRROR); its levels are checked against its recorded grades everywhere."""

from __future__ import annotations

import functools
import os
import hashlib
import http.server
import re
import shutil
import sys
import threading
from pathlib import Path

import pytest
import yaml

from conftest import REPO, plan, run_snakemake
from growlm import corpus, sources
from growlm.errors import GrowlmError
from growlm.jobs import corpus as corpus_jobs
from growlm.jobs import tokenizer as tokenizer_jobs

sys.path.insert(0, str(REPO / "bench"))
import children_large as gen  # noqa: E402 (bench/ is not a package)

BOOKS = REPO / "workflow" / "resources" / "corpus"
SMALL = {18155: "pg18155_story_of_the_three_little_pigs.txt", 18735: "pg18735_little_red_hen.txt",
         14642: "pg14642_mcguffey_eclectic_primer.txt"}  # a primer: the one easy book of the three
# larger held-out shares than the defaults, so that a level of one small book fills all three splits
CORPUS = {"min_words": 3, "max_words": 60, "val_fraction": 0.2, "test_fraction": 0.2}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no request lines on stderr
        pass


@pytest.fixture
def served(tmp_path):
    """(the folder the books are served from as <id>.txt, their base URL, a function that stops the server)."""
    folder = tmp_path / "served"
    folder.mkdir()
    for pg_id, name in SMALL.items():
        shutil.copy(BOOKS / name, folder / f"{pg_id}.txt")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        if thread.is_alive():
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)

    yield folder, f"http://127.0.0.1:{server.server_address[1]}", stop
    stop()


def _mirror_and_manifest(tmp_path: Path, base_url: str) -> tuple[Path, Path]:
    """A mirror folder of the three books (pg<id>.txt) and a manifest in the GITenberg layout naming them."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    rows = ["pg_id,title,author,sha256,raw_url,converted"]
    for pg_id, name in SMALL.items():
        shutil.copy(BOOKS / name, mirror / f"pg{pg_id}.txt")
        digest = hashlib.sha256((BOOKS / name).read_bytes()).hexdigest()
        rows.append(f'{pg_id},"{name[:-4]}","Author, An",{digest},{base_url}/{pg_id}.txt,no')
    (mirror / "manifest.csv").write_text("\n".join(rows) + "\n")
    return mirror, mirror / "manifest.csv"


def _build(sources_: list[dict], root: Path) -> dict[str, bytes]:
    """The corpus jobs from download to token files, in this process: {path under root: bytes} of every
    download and token file."""
    for s in sources_:
        corpus_jobs.download_source(s, root / "downloads" / f"{s['name']}.txt")
        corpus_jobs.prepare_source({"source": s, "corpus": CORPUS}, inputs=[str(root / "downloads" / f"{s['name']}.txt")],
                                   out_dir=root / "sources" / s["name"], threads=1)
    levels = sorted({str(s["level"]) for s in sources_})
    for level in levels:
        names = [s["name"] for s in sources_ if str(s["level"]) == level]
        corpus_jobs.build_level(level, names, [root / "sources" / n for n in names], out_dir=root / f"level{level}",
                                stats_file=root / f"level{level}" / "stats.json")
    tokenizer_jobs.fit_tokenizer([str(root / f"level{lv}" / "train.txt") for lv in levels], root / "tokenizer",
                                 vocab_size=300, min_frequency=2, max_length=64)
    for level in levels:
        for split in corpus.SPLITS:
            tokenizer_jobs.encode_split(root / f"level{level}" / f"{split}.txt", root / "tokenizer",
                                        root / "tokens" / f"level{level}" / f"{split}.npy",
                                        stats_file=root / f"level{level}" / "stats.json", split=split, threads=1)
    files = [*root.glob("downloads/*.txt"), *root.glob("tokens/*/*.npy")]
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(files)}


def test_the_overlay_builds_the_same_token_files_from_urls_and_from_a_mirror(tmp_path, served, monkeypatch):
    folder, base_url, stop = served
    mirror, manifest = _mirror_and_manifest(tmp_path, base_url)
    kept, left_out = gen.books(mirror, manifest)
    assert len(kept) == 3 and not left_out
    overlay = yaml.safe_load(gen.render(kept, left_out))
    books = overlay["corpus"]["sources"]
    assert {b["name"] for b in books} == {f"pg{i}" for i in SMALL} and all(b["url"].startswith(base_url) for b in books)

    monkeypatch.delenv(sources.MIRROR_ENV, raising=False)
    from_urls = _build(books, tmp_path / "urls")
    stop()  # no URL answers now: what the second build reads comes from the mirror
    with pytest.raises(GrowlmError, match=f"'{books[0]['name']}': download of .*GROWLM_MIRROR to a folder holding "
                                          f"{books[0]['name']}.txt"):
        corpus_jobs.download_source(books[0], tmp_path / "nowhere" / "x.txt")
    monkeypatch.setenv(sources.MIRROR_ENV, str(mirror))
    from_mirror = _build(books, tmp_path / "mirrored")

    levels = {str(b["level"]) for b in books}
    assert [b["level"] for b in books] == [0, 1, 1]  # the primer is easy, the stories are not (grade <= 5.2)
    assert len(from_urls) == 3 + 3 * len(levels) and from_urls.keys() == from_mirror.keys()
    for name, data in from_urls.items():
        assert from_mirror[name] == data, name  # byte for byte
    assert all(len(data) > 128 for name, data in from_urls.items() if name.endswith("train.npy"))


def test_a_wrong_sha256_is_refused_naming_the_book(tmp_path, served):
    folder, base_url, _ = served
    mirror, _ = _mirror_and_manifest(tmp_path, base_url)
    good = hashlib.sha256((mirror / "pg18735.txt").read_bytes()).hexdigest()
    book = {"name": "pg18735", "level": 0, "url": f"{base_url}/18735.txt", "sha256": good}
    (mirror / "pg18735.txt").write_bytes((mirror / "pg18735.txt").read_bytes().replace(b"Hen", b"Hat", 1))
    dest = tmp_path / "out" / "pg18735.txt"
    with pytest.raises(GrowlmError, match=r"'pg18735': checksum mismatch for .*mirror/pg18735\.txt") as err:
        corpus.download_source(book["url"], dest, good, "pg18735", mirror=mirror)
    assert good in str(err.value) and not dest.exists() and list(dest.parent.iterdir()) == []
    with pytest.raises(GrowlmError, match=r"'pg18735': checksum mismatch for http://127\.0\.0\.1"):
        corpus.download_source(book["url"], dest, "0" * 64, "pg18735")  # the download itself, a wrong sum
    assert corpus.download_source(book["url"], dest, good, "pg18735") == dest  # the right one, downloaded
    # a book the mirror lacks is downloaded
    (mirror / "pg18735.txt").unlink()
    assert corpus.download_source(book["url"], tmp_path / "out" / "again.txt", good, "pg18735", mirror=mirror)
    # and the generator refuses a book whose file is not the manifest's
    (folder / "18155.txt").unlink()
    (mirror / "pg18155.txt").write_text("not the book\n")
    with pytest.raises(GrowlmError, match=r"book pg18155 .*sha256"):
        gen.books(mirror, mirror / "manifest.csv")


def test_the_generator_levels_books_by_growlm_grade(tmp_path):
    """Each book's grade is growlm's Flesch-Kincaid grade of the sentences its source contributes (the
    units the corpus keeps, counted by `flesch_kincaid_grade`), and its level follows the rule."""
    mirror, manifest = _mirror_and_manifest(tmp_path, "https://example.org")
    kept, _ = gen.books(mirror, manifest)
    settings = sources.settings_of({"name": "x", "level": 0, "url": "https://example.org/x.txt"},
                                   gen.corpus_defaults())
    for book in kept:
        units = corpus.units(corpus.read_source(mirror / f"pg{book['pg_id']}.txt"), settings)
        assert book["grade"] == pytest.approx(corpus.flesch_kincaid_grade(units), abs=0.005)
        assert book["level"] == (0 if book["grade"] <= gen.LEVEL0_MAX_GRADE else 1)
    assert gen.level_of(gen.LEVEL0_MAX_GRADE) == 0 and gen.level_of(gen.LEVEL0_MAX_GRADE + 0.01) == 1
    # a Latin-1 original converted to UTF-8 is left out: its URL does not serve the bytes its sha256 names
    rows = manifest.read_text().splitlines()
    manifest.write_text("\n".join([rows[0], rows[1][:-2] + "yes", *rows[2:]]) + "\n")
    kept, left_out = gen.books(mirror, manifest)
    assert len(kept) == 2 and [b["pg_id"] for b in left_out] == [rows[1].split(",")[0]]


@functools.cache
def _overlay() -> tuple[str, list[dict]]:
    text = (REPO / "config" / "children-large.yaml").read_text()
    return text, yaml.safe_load(text)["corpus"]["sources"]


def test_the_overlay_names_every_book_pinned_and_levels_follow_the_rule():
    text, books = _overlay()
    grades = gen.recorded_grades(text)
    assert len(books) > 300 and len(grades) == len(books) == len({b["name"] for b in books})
    for b in books:
        assert set(b) == {"name", "level", "url", "sha256"}, b
        assert gen.PINNED_URL.match(b["url"]) and re.fullmatch(r"[0-9a-f]{64}", b["sha256"]), b
        assert b["level"] == gen.level_of(grades[b["name"]]), b
    counts = [sum(1 for b in books if b["level"] == level) for level in (0, 1)]
    assert min(counts) > 100  # the threshold parts the books into two levels of comparable size


def test_the_overlay_plans_and_a_missing_mirror_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(sources.MIRROR_ENV, raising=False)
    levels = [f"results/children-large/corpus/level{level}/stats.json" for level in (0, 1)]
    error, jobs = plan(REPO, configfiles=["config/children-large.yaml"], targets=levels)
    assert error is None, error
    n = len(_overlay()[1])
    assert sum(1 for rule, _ in jobs if rule == "download_source") == n
    error, _ = plan(REPO, f"corpus={{mirror: {tmp_path / 'absent'}}}", configfiles=["config/children-large.yaml"],
                    targets=levels)
    assert error and "corpus.mirror" in error and "absent" in error
    monkeypatch.setenv(sources.MIRROR_ENV, str(tmp_path / "absent"))
    error, _ = plan(REPO, configfiles=["config/children-large.yaml"], targets=levels)
    assert error and "$GROWLM_MIRROR" in error


def test_corpus_mirror_reaches_the_download_job_and_reruns_nothing(workflow_dir, monkeypatch):
    """config/online.yaml names the bundled books as downloads under their own names: the bundled folder is
    its mirror. Set in the config, the mirror reaches the job (one Snakemake run, one job, no network), and
    leaving it out afterwards plans no job: where a checked file came from is not what a job read."""
    monkeypatch.delenv(sources.MIRROR_ENV, raising=False)
    target = "results/online/downloads/pg18735_little_red_hen.txt"
    run_snakemake(workflow_dir, "--cores", "1", "--configfile", "config/config.yaml", "config/online.yaml",
                  "--config", "corpus={mirror: workflow/resources/corpus}", "--", target)
    assert (workflow_dir / target).read_bytes() == (BOOKS / "pg18735_little_red_hen.txt").read_bytes()
    logged = (workflow_dir / "results/online/logs/download_source/pg18735_little_red_hen.log").read_text()
    assert "8844 bytes from the mirror" in logged and "workflow/resources/corpus" in logged
    error, jobs = plan(workflow_dir, configfiles=["config/online.yaml"], targets=[target])
    assert error is None and jobs == [], (error, jobs)


@pytest.mark.skipif(not os.environ.get(sources.MIRROR_ENV), reason="the books are not here: set "
                    "GROWLM_MIRROR to a folder of them (pg<id>.txt) to recompute the overlay's grades")
def test_the_overlays_grades_are_growlms_own_for_a_few_books():
    mirror = sources.mirror_folder()
    text, books = _overlay()
    grades = gen.recorded_grades(text)
    few = sorted(books, key=lambda b: (mirror / f"{b['name']}.txt").stat().st_size)[:2]
    few += [b for b in books if b["level"] == 1][:1] + [b for b in books if b["level"] == 0][-1:]
    for b in few:
        path = mirror / f"{b['name']}.txt"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == b["sha256"]
        assert gen.book_grade(path) == pytest.approx(grades[b["name"]], abs=0.005), b["name"]
        assert b["level"] == gen.level_of(gen.book_grade(path))
