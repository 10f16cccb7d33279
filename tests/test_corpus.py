"""The corpus stage: cleaning Gutenberg text, sentence splitting, splits, level files, downloads."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from growlm import corpus, prepare
from growlm.errors import GrowlmError

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "workflow" / "resources" / "corpus"
LEVEL0 = [
    "pg68453_summers_readers_primer", "pg14642_mcguffey_eclectic_primer", "pg13853_new_national_first_reader",
    "pg14640_mcguffey_first_reader", "pg65323_aldine_first_reader", "pg70598_a_pet_reader",
    "pg7841_a_primary_reader_smythe", "pg16046_boy_blue_and_his_friends",
]

# Modelled on McGuffey's Eclectic Primer and the New National First Reader.
PRIMER = """\
[Transcriber's Notes:

Welcome to the schoolroom of 1900. The moral tone is plain.

Don Kostuch
]


ECLECTIC EDUCATIONAL SERIES.

McGUFFEY'S[Registered]

Preface

The flattering success of McGuffey's Revised Readers has induced the
Publishers to prepare a REVISED PRIMER.
(iii)


Lesson 1

a   and  cat  rat

a   e   d   n   r   t

[Illustration: Rat]

a rat    a cat

A cat and a rat.



LESSON II.

NEW WORDS.

boy
the
run

[Illustration: Boy running and old man, with gout,
sitting.]

The cat has a rat. The rat ran
at Ann, and _Ann_ ran at the
cat.

[Script: The cat ran. Ann ran.]

SCRIPT EXERCISE.

CONTENTS

    The Wind                     26
    The Leaves                   28

Can the dog--the big dog--get the rat?

"Yes," said \u201cNed\u201d; \u2018it can.\u2019

       *       *       *       *       *

~Sing~, little *bird*, sing to me!
"""


def cleaned() -> str:
    return "\n".join(corpus.clean_gutenberg(PRIMER))


def test_clean_removes_bracket_blocks_and_front_matter():
    text = cleaned()
    assert "[" not in text and "]" not in text
    assert "Illustration" not in text and "Script" not in text
    assert "Transcriber" not in text and "schoolroom" not in text  # multi-line transcriber's note
    assert "gout" not in text and "sitting" not in text  # multi-line illustration tag
    assert "flattering success" not in text  # preface
    assert "ECLECTIC" not in text and "McGUFFEY" not in text  # title page


def test_clean_removes_lessons_word_lists_page_numbers_and_contents():
    paragraphs = corpus.clean_gutenberg(PRIMER)
    text = "\n".join(paragraphs)
    assert "LESSON" not in text and "Lesson" not in text
    assert "a   and" not in text and "a rat    a cat" not in text and "d   n" not in text
    assert "boy\nthe" not in text and "NEW WORDS" not in text
    assert "(iii)" not in text and "The Wind" not in text and "26" not in text
    assert "A cat and a rat." in paragraphs


def test_clean_rejoins_lines_and_normalises_markup():
    paragraphs = corpus.clean_gutenberg(PRIMER)
    assert "The cat has a rat. The rat ran at Ann, and Ann ran at the cat." in paragraphs
    assert "Can the dog\u2014the big dog\u2014get the rat?" in paragraphs
    assert "\"Yes,\" said \"Ned\"; 'it can.'" in paragraphs
    assert "Sing, little bird, sing to me!" in paragraphs
    text = "\n".join(paragraphs)
    for mark in ("_", "*", "~", "--", "\u201c", "\u2019"):
        assert mark not in text


def test_clean_strips_gutenberg_header_and_footer():
    raw = (
        "The Project Gutenberg eBook of A Primer\n\nThis ebook is for the use of anyone.\n\n"
        "*** START OF THE PROJECT GUTENBERG EBOOK A PRIMER ***\n\nSee the cat run.\n\n"
        "*** END OF THE PROJECT GUTENBERG EBOOK A PRIMER ***\n\nUpdated editions will replace the previous one.\n"
    )
    assert corpus.clean_gutenberg(raw) == ["See the cat run."]


def test_clean_drops_appendix_vocabulary_and_adverts():
    raw = (
        "The cat is on the mat.\n\n"
        "12mo, 220 pages, cloth, gilt top--$1.25.\n\n"
        "\"A charming book for children.\"--_Boston Transcript._\n\n"
        "VOCABULARY\n\nThe words below are new in this book.\n\ncat   mat   sat\n"
    )
    assert corpus.clean_gutenberg(raw) == ["The cat is on the mat."]


def test_split_sentences_splits_and_drops_fragments():
    paragraphs = [
        "Mr. Brown has a dog. The dog can run! Can you see it?",
        "Oh! Yes. Run, Rab, run.",
        "12. 34.",
    ]
    sentences = corpus.split_sentences(paragraphs)
    assert sentences == ["Mr. Brown has a dog.", "The dog can run!", "Can you see it?", "Run, Rab, run."]
    assert corpus.split_sentences(["See the big cat."], min_words=5) == []
    long = " ".join(["the cat ran"] * 30) + "."
    assert corpus.split_sentences([long]) == []
    assert corpus.split_sentences([long], max_words=100) == [long]


def test_split_of_is_deterministic_and_independent_of_other_sentences():
    sentences = [f"The cat number {i} sat on the mat." for i in range(10_000)]
    first = {s: corpus.split_of(s, 0.05, 0.05) for s in sentences[:1000]}
    again = {s: corpus.split_of(s, 0.05, 0.05) for s in sentences}  # more sentences around them
    assert all(again[s] == split for s, split in first.items())
    counts = {split: list(again.values()).count(split) for split in corpus.SPLITS}
    assert 400 <= counts["val"] <= 600 and 400 <= counts["test"] <= 600
    assert counts["train"] == 10_000 - counts["val"] - counts["test"]
    assert {corpus.split_of(s, 0.0, 0.0) for s in sentences[:200]} == {"train"}
    with pytest.raises(GrowlmError):
        corpus.split_of("A cat sat.", 0.6, 0.5)


def synthetic_book(n: int, start: int = 0) -> str:
    return "\n\n".join(f"The little dog number {i} ran to the red barn." for i in range(start, start + n))


def test_prepare_level_writes_splits_and_removes_duplicates(tmp_path):
    sources = [("a", synthetic_book(300)), ("b", synthetic_book(300, start=200))]  # 100 duplicates
    stats = prepare.prepare_level(sources, tmp_path)
    lines = {split: (tmp_path / f"{split}.txt").read_text(encoding="utf-8").splitlines() for split in corpus.SPLITS}
    every = [line for split in corpus.SPLITS for line in lines[split]]
    assert len(every) == len(set(every)) == 500
    assert stats["sentences"] == 500 and stats["sources"] == {"a": 300, "b": 200}
    assert {split: stats["splits"][split]["sentences"] for split in corpus.SPLITS} == {
        split: len(lines[split]) for split in corpus.SPLITS
    }
    assert all(corpus.split_of(line, 0.05, 0.05) == split for split in corpus.SPLITS for line in lines[split])
    assert lines["train"][0] == "The little dog number 0 ran to the red barn."  # order kept
    assert stats["mean_sentence_words"] == pytest.approx(9.0)  # the number is not a word
    assert stats["words"] == 4500


def test_prepare_level_raises_on_empty_level(tmp_path):
    with pytest.raises(GrowlmError, match="pg1_empty"):
        prepare.prepare_level([("pg1_empty", "[Illustration]\n\nLESSON I.\n\ncat   rat\n")], tmp_path)
    with pytest.raises(GrowlmError, match="tiny"):  # two sentences cannot fill three splits
        prepare.prepare_level([("tiny", "The cat sat on the mat.\n\nThe dog ran to the barn.")], tmp_path)


def test_read_source_missing_file_names_it(tmp_path):
    with pytest.raises(GrowlmError, match="nope.txt"):
        corpus.read_source(tmp_path / "nope.txt")


def test_download_source_checks_sha256(tmp_path):
    src = tmp_path / "book.txt"
    src.write_text("See the cat run.\n", encoding="utf-8")
    good = hashlib.sha256(src.read_bytes()).hexdigest()
    dest = tmp_path / "out" / "book.txt"
    assert corpus.download_source(src.as_uri(), dest, good, "pg1_book") == dest
    assert dest.read_bytes() == src.read_bytes()

    bad = "0" * 64
    dest2 = tmp_path / "out" / "bad.txt"
    with pytest.raises(GrowlmError, match="pg1_book") as err:
        corpus.download_source(src.as_uri(), dest2, bad, "pg1_book")
    assert bad in str(err.value) and good in str(err.value)
    assert not dest2.exists() and list(dest2.parent.iterdir()) == [dest]  # temp file removed

    with pytest.warns(UserWarning, match=good):
        corpus.download_source(src.as_uri(), tmp_path / "out" / "unchecked.txt", None, "pg1_book")
    with pytest.raises(GrowlmError, match="pg2_missing"):
        corpus.download_source((tmp_path / "missing.txt").as_uri(), tmp_path / "x.txt", None, "pg2_missing")


def test_bundled_corpus_levels(tmp_path):
    import yaml

    default = {s["bundled"] for s in yaml.safe_load((REPO / "config" / "config.yaml").read_text())["corpus"]["sources"]}
    assert len(default) == 27 and len(list(CORPUS.glob("pg*.txt"))) == 36  # nine more for larger experiments
    files = sorted(CORPUS / name for name in default)
    level0 = [(f.stem, corpus.read_source(f)) for f in files if f.stem in LEVEL0]
    level1 = [(f.stem, corpus.read_source(f)) for f in files if f.stem not in LEVEL0]
    assert len(level0) == 8 and len(level1) == 19
    s0 = prepare.prepare_level(level0, tmp_path / "level0")
    s1 = prepare.prepare_level(level1, tmp_path / "level1")
    assert 4000 < s0["sentences"] < s1["sentences"]
    assert s0["mean_sentence_words"] < 10 and s0["mean_sentence_words"] + 2 < s1["mean_sentence_words"]
    assert s0["flesch_kincaid_grade"] < s1["flesch_kincaid_grade"]
    assert all(n > 0 for n in s0["sources"].values()) and all(n > 0 for n in s1["sources"].values())
    for level in ("level0", "level1"):
        for split in corpus.SPLITS:
            text = (tmp_path / level / f"{split}.txt").read_text(encoding="utf-8")
            for bad in ("[Illustration", "LESSON", "Lesson I", "_", "*", "Gutenberg", "Copyright", "PREFACE"):
                assert bad not in text, (level, split, bad)
