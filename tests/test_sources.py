"""Your own corpus: every kind of source through `datasets.load_dataset`, the cleaners, named levels,
caps and token files. The data are built here from the bundled books (no network): plain text with
`<|endoftext|>` separators, `.jsonl` folders, `.parquet` and `.csv` files, and a dataset folder in the
Hub's own layout (a README.md card naming its data files), which loads through the very call a Hub
id takes (`hf:`)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from conftest import REPO, copy_workflow, run_snakemake
from growlm import corpus, prepare, sources
from growlm.errors import GrowlmError, sha256
from growlm.tokenizer import fit_tokenizer, load_tokenizer
from growlm.tokens import NpyWriter, encode_file, load_tokens, token_dtype, token_sources

BOOKS = REPO / "workflow" / "resources" / "corpus"
CORPUS = {"min_words": 3, "max_words": 60, "val_fraction": 0.05, "test_fraction": 0.05}


def stories(book: str, count: int, *, start: int = 0) -> list[str]:
    """Short documents made of a bundled book's paragraphs (three a story), each numbered."""
    paragraphs = corpus.clean_gutenberg(corpus.read_source(BOOKS / book))
    out = []
    for i in range(start, start + count):
        picked = [paragraphs[(3 * i + k) % len(paragraphs)] for k in range(3)]
        out.append(f"Story {i}. " + "\n".join(picked))
    return out


def read_all(source: dict, location=None) -> list[str]:
    how = sources.settings_of(source, CORPUS)
    return [doc for batch in sources.documents(source, location, how) for doc in batch]


def hub_folder(root: Path, train: list[str], validation: list[str]) -> Path:
    """A dataset in the Hub's layout: a card whose `configs` name parquet shards per split."""
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.table({"text": train, "id": list(range(len(train)))}), root / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": validation}), root / "data" / "validation-00000-of-00001.parquet")
    (root / "README.md").write_text("---\nlicense: cc0-1.0\nconfigs:\n- config_name: default\n  data_files:\n"
                                    "  - split: train\n    path: data/train-*\n  - split: validation\n"
                                    "    path: data/validation-*\n---\n# A tiny graded corpus\n")
    return root


# ---------------------------------------------------------------------------------------------
# reading: every format gives the same documents
# ---------------------------------------------------------------------------------------------


def test_every_format_reads_the_same_documents(tmp_path):
    docs = stories("pg19994_aesop_for_children.txt", 40)
    (tmp_path / "jsonl").mkdir()
    for part, chunk in enumerate((docs[:25], docs[25:])):
        (tmp_path / "jsonl" / f"part{part}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in chunk))
    with gzip.open(tmp_path / "stories.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    pq.write_table(pa.table({"text": docs}), tmp_path / "stories.parquet")
    pacsv.write_csv(pa.table({"id": list(range(len(docs))), "text": docs}), tmp_path / "stories.csv")
    (tmp_path / "stories.txt").write_text("".join(d + "\n<|endoftext|>\n" for d in docs))
    hub = hub_folder(tmp_path / "hub", docs, ["Held out."])
    kinds = {
        "jsonl folder": {"path": str(tmp_path / "jsonl")},
        "jsonl glob": {"path": str(tmp_path / "jsonl" / "*.jsonl")},
        "jsonl.gz": {"path": str(tmp_path / "stories.jsonl.gz")},
        "parquet": {"path": str(tmp_path / "stories.parquet")},
        "csv": {"path": str(tmp_path / "stories.csv")},
        "txt with <|endoftext|>": {"path": str(tmp_path / "stories.txt"), "clean": "documents"},
        "Hub layout via hf": {"hf": str(hub)},
        "Hub layout via path": {"path": str(hub)},
    }
    for what, spec in kinds.items():
        assert read_all({"name": "s", "level": 0, **spec}) == docs, what
    # the Hub card's other split
    assert read_all({"name": "s", "level": 0, "hf": str(hub), "split": "validation"}) == ["Held out."]


def test_separators_and_max_rows(tmp_path):
    text = ("One little story.\nIt has two lines.\n<|endoftext|>\nA second story ends here.<|endoftext|>Third one "
            "starts on the same line.\n\n\nIt goes on after a gap.\n<|endoftext|>\n")
    (tmp_path / "a.txt").write_text(text)
    src = {"name": "a", "level": 0, "path": str(tmp_path / "a.txt"), "clean": "documents"}
    assert read_all(src) == ["One little story.\nIt has two lines.", "A second story ends here.",
                             "Third one starts on the same line.\n\n\nIt goes on after a gap."]
    assert read_all({**src, "separator": "blank"})[-1] == "It goes on after a gap.\n<|endoftext|>"
    assert read_all({**src, "separator": "line"})[:3] == ["One little story.", "It has two lines.", "<|endoftext|>"]
    assert read_all({**src, "max_rows": 2}) == read_all(src)[:2]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"Row number {i} is here."}) + "\n" for i in range(100)))
    assert read_all({"name": "r", "level": 0, "path": str(rows), "max_rows": 7}) == [
        f"Row number {i} is here." for i in range(7)]


def test_documents_longer_than_a_read_are_whole(tmp_path):
    """A document that straddles the reader's batches of lines comes back whole."""
    long_doc = "\n".join(f"Line {i} of a long story about a fox." for i in range(30000))
    (tmp_path / "long.txt").write_text("Short one.\n<|endoftext|>\n" + long_doc + "\n<|endoftext|>\nLast one.\n")
    docs = read_all({"name": "l", "level": 0, "path": str(tmp_path / "long.txt"), "clean": "documents"})
    assert docs == ["Short one.", long_doc, "Last one."]


def test_a_wrong_column_or_path_is_named(tmp_path):
    (tmp_path / "s.jsonl").write_text(json.dumps({"story": "A fox ran far away."}) + "\n")
    with pytest.raises(GrowlmError, match=r"no column 'text' \(columns: story\); set `column:`"):
        read_all({"name": "s", "level": 0, "path": str(tmp_path / "s.jsonl")})
    assert read_all({"name": "s", "level": 0, "path": str(tmp_path / "s.jsonl"), "column": "story"}) == [
        "A fox ran far away."]
    with pytest.raises(GrowlmError, match="no data file"):
        read_all({"name": "s", "level": 0, "path": str(tmp_path / "nothing-*.jsonl")})
    with pytest.raises(GrowlmError, match="datasets could not load"):
        read_all({"name": "s", "level": 0, "hf": str(tmp_path / "not-a-dataset"), "split": "train"})


def test_provenance_names_the_exact_files(tmp_path):
    hub = hub_folder(tmp_path / "hub", ["A cat sat down."], ["A dog ran."])
    record = sources.provenance({"name": "h", "level": "x", "hf": str(hub)}, None,
                                sources.settings_of({"name": "h", "level": "x", "hf": str(hub)}, CORPUS))
    files = {Path(f["path"]).name: f["sha256"] for f in record["files"]}
    assert files == {p.name: sha256(p) for p in (hub / "data").iterdir()}
    assert record["hf"] == str(hub) and record["split"] == "train"


# ---------------------------------------------------------------------------------------------
# cleaning and levels
# ---------------------------------------------------------------------------------------------


def test_clean_documents_keeps_every_document_the_gutenberg_cleaner_drops(tmp_path):
    """TinyStories-like text: `clean: documents` keeps each document whole, one per line; the book
    cleaner would take a story opening "By the river," for a title page and "$2" for an advert."""
    docs = [f"Story {i}: the little dog ran to the red barn and back." for i in range(200)]
    docs += ["By the river, the fox sat and thought about dinner.", "The toy cost $2 and Tom had only one dollar.",
             "A story\n\nwith a blank line inside it ends well."]
    raw = tmp_path / "stories.txt"
    raw.write_text("".join(d + "\n<|endoftext|>\n" for d in docs))
    source = {"name": "stories", "level": 0, "path": str(raw), "clean": "documents"}
    how = sources.settings_of(source, CORPUS)
    assert how["sentences"] is False
    counts = prepare.prepare_source(sources.documents(source, None, how), how, tmp_path / "src", name="stories")
    stats = prepare.build_level("stories", [("stories", tmp_path / "src")], tmp_path / "level")
    kept = [line for split in prepare.SPLITS for line in (tmp_path / "level" / f"{split}.txt").read_text().splitlines()]
    assert counts["documents"] == len(docs) and stats["sentences"] == len(docs) == len(kept)
    assert "By the river, the fox sat and thought about dinner." in kept
    assert "The toy cost $2 and Tom had only one dollar." in kept
    assert "A story with a blank line inside it ends well." in kept  # one document, one line
    book = corpus.clean_gutenberg("\n\n".join(docs[-3:-1]))
    assert not any("river" in p or "$2" in p for p in book)  # what the book cleaner would have done


def test_parallel_preparation_writes_what_one_process_writes(tmp_path):
    docs = stories("pg22420_book_of_nature_myths.txt", 300)
    source = {"name": "m", "level": 0, "path": "unused", "clean": "documents", "sentences": True}
    how = sources.settings_of(source, CORPUS)
    batches = [docs[i:i + 20] for i in range(0, len(docs), 20)]
    one = prepare.prepare_source(iter(batches), how, tmp_path / "one", processes=1)
    two = prepare.prepare_source(iter(batches), how, tmp_path / "two", processes=2)
    assert one == two and one["units"] > 1000
    for f in sorted((tmp_path / "one").iterdir()):
        assert f.read_bytes() == (tmp_path / "two" / f.name).read_bytes(), f.name


def test_a_level_drops_repeats_across_sources_in_order(tmp_path):
    """Repeats are found through bucket files, whatever the chunk: the first occurrence stays, in
    the configured order of the sources, and the statistics count only what was kept."""
    how = {"clean": "documents", "sentences": False, **CORPUS}
    a = [f"The fox number {i} ran home." for i in range(400)]
    b = [f"The fox number {i} ran home." for i in range(300, 700)] + a[:5]  # 105 repeats
    prepare.prepare_source([a], how, tmp_path / "a")
    prepare.prepare_source([b[:200], b[200:]], how, tmp_path / "b")
    stats = prepare.build_level("L", [("a", tmp_path / "a"), ("b", tmp_path / "b")], tmp_path / "level", chunk=7)
    lines = {s: (tmp_path / "level" / f"{s}.txt").read_text().splitlines() for s in prepare.SPLITS}
    every = [line for s in prepare.SPLITS for line in lines[s]]
    assert sorted(every) == sorted(set(a) | set(b)) and len(every) == 700
    assert stats["sources"] == {"a": 400, "b": 300}
    assert stats["words"] == sum(corpus.alpha_words(x) for x in every)
    assert stats["flesch_kincaid_grade"] == corpus.level_statistics(every)["flesch_kincaid_grade"]
    for s in prepare.SPLITS:  # each split keeps the sources' order, a's lines first
        start, end = stats["lines"]["b"][s]
        assert lines[s][:start] == [x for x in a if corpus.split_of(x, 0.05, 0.05) == s]
        assert end == len(lines[s])


# ---------------------------------------------------------------------------------------------
# token files
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_the_streamed_token_file_is_what_np_save_writes(tmp_path, dtype):
    arr = np.random.default_rng(0).integers(0, 60000, 100_003).astype(dtype)
    writer = NpyWriter(tmp_path / "streamed.npy", dtype)
    for i in range(0, arr.size, 9999):
        writer.write(arr[i:i + 9999])
    writer.close()
    np.save(tmp_path / "saved.npy", arr)
    assert (tmp_path / "streamed.npy").read_bytes() == (tmp_path / "saved.npy").read_bytes()
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_a_vocabulary_beyond_16_bits_is_stored_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<|endoftext|>"] + [f"w{i}" for i in range(70_000)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "s.txt").write_text("w1 w69999 w65536\nw2\n")
    n = encode_file(tmp_path / "s.txt", tok, tmp_path / "s.npy")
    arr = load_tokens(tmp_path / "s.npy")
    assert n == 6 and arr.dtype == np.uint32 and arr.tolist() == [2, 70000, 65537, 0, 3, 0]


def test_max_tokens_caps_a_source_and_spans_are_recorded(tmp_path):
    how = {"clean": "documents", "sentences": False, **CORPUS}
    a = [f"Fox number {i} ran to the barn and back again." for i in range(300)]
    b = [f"Hen number {i} sat on the nest all day long." for i in range(300)]
    prepare.prepare_source([a], how, tmp_path / "a")
    prepare.prepare_source([b], how, tmp_path / "b")
    stats = prepare.build_level("L", [("a", tmp_path / "a"), ("b", tmp_path / "b")], tmp_path / "level")
    fit_tokenizer([tmp_path / "level" / "train.txt"], tmp_path / "tok", vocab_size=300, min_frequency=1, max_length=32)
    tok = load_tokenizer(tmp_path / "tok")
    lines = {k: v["train"] for k, v in stats["lines"].items()}
    full = encode_file(tmp_path / "level" / "train.txt", tok, tmp_path / "full.npy", sources=lines)
    spans = token_sources(tmp_path / "full.npy")
    assert spans["a"][0] == 0 and spans["a"][1] == spans["b"][0] and spans["b"][1] == full
    capped = encode_file(tmp_path / "level" / "train.txt", tok, tmp_path / "capped.npy", sources=lines,
                         caps={"b": 500})
    spans_c = token_sources(tmp_path / "capped.npy")
    b_tokens = spans_c["b"][1] - spans_c["b"][0]
    per_line = (spans["b"][1] - spans["b"][0]) / (stats["lines"]["b"]["train"][1] - stats["lines"]["b"]["train"][0])
    assert 500 <= b_tokens < 500 + 2 * per_line  # the cap, plus at most the line that reached it
    assert spans_c["a"] == spans["a"] and capped == spans["a"][1] + b_tokens
    assert np.array_equal(load_tokens(tmp_path / "capped.npy")[: spans["a"][1]], load_tokens(tmp_path / "full.npy")[: spans["a"][1]])


# ---------------------------------------------------------------------------------------------
# the workflow: three named levels from a Hub-layout folder, a .jsonl folder and a .parquet file
# ---------------------------------------------------------------------------------------------


def write_own_corpus(wd: Path) -> Path:
    """Three levels of one's own: `primer` (two bundled books), `stories` (a .jsonl folder) and
    `readers` (a .parquet file and a Hub-layout folder read with `hf:`)."""
    data = wd / "data"
    (data / "stories").mkdir(parents=True)
    fables = stories("pg19994_aesop_for_children.txt", 160)
    for part in range(2):
        (data / "stories" / f"part-{part}.jsonl").write_text(
            "".join(json.dumps({"text": d, "part": part}) + "\n" for d in fables[part::2]))
    pq.write_table(pa.table({"text": stories("pg1825_adventures_of_reddy_fox.txt", 120)}), data / "readers.parquet")
    hub_folder(data / "hub_readers", stories("pg2557_old_mother_west_wind.txt", 120), ["Unused."])
    overlay = wd / "own.yaml"
    overlay.write_text(
        "corpus:\n  sources:\n"
        "    - {name: primer_a, level: primer, bundled: pg14642_mcguffey_eclectic_primer.txt}\n"
        "    - {name: primer_b, level: primer, bundled: pg14640_mcguffey_first_reader.txt}\n"
        "    - {name: fables, level: stories, path: data/stories, sentences: true}\n"
        "    - {name: reddy, level: readers, path: data/readers.parquet, max_tokens: 30000}\n"
        "    - {name: west_wind, level: readers, hf: data/hub_readers, split: train}\n"
        "levels: {members: [primer, stories], large: [readers]}\n")
    return overlay


@pytest.mark.slow
def test_three_named_levels_from_your_own_data_run_end_to_end(tmp_path):
    """The tiny experiment on three levels of one's own (write_own_corpus) through to its comparison and the
    report's table of the corpus: every source read, each level built and encoded, the member trained on
    its two levels, the grown model refined and every model evaluated on all three. One member and a
    single-source method (a second member would train on the same two levels again), no profiling, no
    control arms, and none of the report's other figures and tables (they read only the comparison's
    files): the corpus is what is tested here."""
    wd = copy_workflow(tmp_path / "wf")
    overlay = write_own_corpus(wd)
    tiny = wd / "tests" / "config" / "tiny.yaml"
    fast = wd / "fast.yaml"
    fast.write_text("methods: [[hyperclone, zero_block]]\nn: [1]\nprofile: {tools: []}\n"
                    "controls: {single_member: false, ensemble: false}\n")
    run_snakemake(wd, "results/tiny/eval/comparison.csv", "results/tiny/report/corpus_stats.html",
                  "--cores", "2", "--configfile", str(tiny), str(overlay), str(fast))
    comparison = (wd / "results" / "tiny" / "eval" / "comparison.csv").read_text()
    assert "readers" in comparison.splitlines()[1]  # test_level
    metrics = json.loads((wd / "results/tiny/eval/small/d16_L1/s0/m1/metrics.json").read_text())
    assert set(metrics["levels"]) == {"primer", "stories", "readers"}
    # the member trains on both of its levels, one file after the other
    mix = wd / "results" / "tiny" / "tokens" / "levelprimer+stories" / "train.npy"
    spans = token_sources(mix)
    assert set(spans) == {"primer_a", "primer_b", "fables"} and load_tokens(mix).size == max(v[1] for v in spans.values())
    # provenance: each file of each source by sha256, in the level statistics and on the report page
    stats = json.loads((wd / "results/tiny/corpus/levelreaders/stats.json").read_text())
    parquet = stats["provenance"]["reddy"]["files"][0]
    assert parquet["sha256"] == sha256(wd / "data" / "readers.parquet")
    assert stats["provenance"]["west_wind"]["kind"] == "hf"
    assert {Path(f["path"]).name for f in stats["provenance"]["west_wind"]["files"]} == {
        "train-00000-of-00001.parquet", "validation-00000-of-00001.parquet"}
    table = (wd / "results/tiny/report/corpus_stats.html").read_text()
    for level in ("primer", "stories", "readers"):
        assert f"<td>{level}</td>" in table
    assert re.search(r"readers.parquet sha256 [0-9a-f]{12}", table)
    # the cap: reddy's share of the train tokens is about 90% of its 30000
    readers = token_sources(wd / "results/tiny/tokens/levelreaders/train.npy")
    assert 27000 <= readers["reddy"][1] - readers["reddy"][0] < 27000 + 400


def test_levels_and_sources_are_checked_before_any_job(workflow_dir):
    (workflow_dir / "empty_folder").mkdir()
    overlay = workflow_dir / "bad.yaml"
    overlay.write_text(
        "corpus:\n  sources:\n"
        "    - {name: a, level: 0, bundled: pg14642_mcguffey_eclectic_primer.txt}\n"
        "    - {name: b, level: 1, path: empty_folder}\n"
        "    - {name: c, level: 1, path: 'nothing/*.jsonl'}\n"
        "    - {name: d, level: 1, bundled: pg18735_little_red_hen.txt, revision: main}\n"
        "levels: {members: [0], large: [1, grade2]}\n")
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(overlay), check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "levels.large: level 'grade2' has no source in corpus.sources (levels there: 0, 1)" in text
    assert "corpus.sources[1] (b): path 'empty_folder': the folder holds no data file" in text
    assert "corpus.sources[2] (c): path 'nothing/*.jsonl': no such file (nothing matches the glob)" in text
    assert "corpus.sources[3] (d): revision names a Hub commit; it goes with hf" in text
