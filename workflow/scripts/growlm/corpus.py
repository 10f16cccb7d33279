"""The corpus stage's text functions: a document in, clean units (sentences or documents) out.

Three cleaners, chosen per source (`units`): `clean_gutenberg` turns a raw Project Gutenberg book
into paragraphs of prose: it drops front matter, contents lists, illustration tags, lesson
headings, word lists, phonics keys, page numbers, appendices and publishers' advertisements, and
re-joins hard-wrapped lines (its heuristics are for books: it would drop a story's paragraph that
opens "By the river," as a title page, so other text takes `clean_document`, which only
normalises, or none). `split_sentences` cuts paragraphs into sentences with pysbd, where a source
asks for sentences. The split of a unit depends on its text alone (`split_of`), so adding a source
never moves existing units.

Everything here is a pure function of its inputs, except `read_source` and `download_source`;
streaming a whole corpus through these functions is `growlm.prepare`'s job.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyphen
import pysbd

from growlm.atomic import atomic_path
from growlm.errors import GrowlmError

SPLITS = ("train", "val", "test")

# --------------------------------------------------------------------------- reading


def read_source(path: str | Path) -> str:
    """The text of a bundled (or downloaded) source file, decoded as UTF-8."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise GrowlmError(f"corpus source file {path} does not exist (check corpus.sources in the config)") from None
    except OSError as err:
        raise GrowlmError(f"cannot read corpus source file {path}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise GrowlmError(f"corpus source file {path} is not UTF-8 text (byte {err.start})") from None


def download_source(url: str, dest: Path, sha256: str | None, name: str, *, mirror: Path | None = None) -> Path:
    """Download `url` to `dest` and check its SHA-256; return `dest`.

    With a `mirror` folder that holds `<name>.txt` (the layout of a run's own downloads/ folder), that
    file is copied instead of the URL fetched, and checked against the same sha256: a machine without a
    network builds the very corpus a download builds, and a wrong or damaged file is refused as a wrong
    download is. A source the mirror lacks is downloaded.

    The data goes to a temporary file next to `dest` first and is renamed into place only
    after the checksum matched, so `dest` is either complete and verified or absent.
    `sha256=None` means "not checked": a warning gives the actual sum to put in the config.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    local = Path(mirror) / f"{name}.txt" if mirror is not None else None
    origin = str(local) if local is not None and local.is_file() else url
    digest = hashlib.sha256()
    with atomic_path(dest) as tmp:  # renamed onto dest only if the block ends without an error
        try:
            with open(tmp, "wb") as out, (open(local, "rb") if origin != url  # noqa: SIM115 (closed by with)
                                          else urllib.request.urlopen(url, timeout=60)) as response:
                while chunk := response.read(1 << 16):
                    digest.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", None) or err
            if origin != url:
                raise GrowlmError(f"corpus source {name!r}: reading {origin} failed: {reason}") from None
            hint = (f"; the mirror {mirror} has no {local.name}" if local is not None else
                    f"; without a network, set corpus.mirror or $GROWLM_MIRROR to a folder holding {name}.txt")
            raise GrowlmError(f"corpus source {name!r}: download of {url} failed: {reason}{hint}") from None
        actual = digest.hexdigest()
        if sha256 is None:
            warnings.warn(
                f"corpus source {name!r}: checksum not checked (sha256 is null); "
                f"the sha256 of {origin} is {actual}",
                stacklevel=2,
            )
        elif actual != sha256.strip().lower():
            raise GrowlmError(
                f"corpus source {name!r}: checksum mismatch for {origin}: "
                f"expected sha256 {sha256.strip().lower()}, got {actual}"
            )
    return dest


def line_blocks(fh, *, max_lines: int = 1 << 16, max_chars: int = 8 << 20) -> Iterator[list[str]]:
    """Lines of a text file (without their newline) in blocks of at most `max_lines` lines and about
    `max_chars` characters: a block never holds the whole of a file of long lines."""
    block, size = [], 0
    for line in fh:
        block.append(line[:-1] if line.endswith("\n") else line)
        size += len(line)
        if len(block) >= max_lines or size >= max_chars:
            yield block
            block, size = [], 0
    if block:
        yield block


# --------------------------------------------------------------------------- cleaning

_PG_START = re.compile(r"^\*\*\*\s*START OF (?:THE|THIS) PROJECT GUTENBERG.*$", re.IGNORECASE | re.MULTILINE)
_PG_END = re.compile(r"^\*\*\*\s*END OF (?:THE|THIS) PROJECT GUTENBERG", re.IGNORECASE | re.MULTILINE)
# A [...] block with no bracket inside it (applied repeatedly, so nesting is handled).
_BRACKETS = re.compile(r"\[[^\[\]]{0,4000}\]")
_BRACKET_HEADING = re.compile(r"\[\s*Illustration:\s*([A-Za-z' ]+?)\.?\s*\]")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                         "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
                         "\u00ab": '"', "\u00bb": '"', "\u00a0": " "})
_DASHES = re.compile(r"\s*(?:-{2,}|\u2014|\u2015|\u2e3a)\s*")
_MARKUP = re.compile(r"[_*~=]")
_SENTENCE_END = re.compile(r"[.!?:\u2014]['\")\]]*$")
# Front matter: a section with this heading is skipped up to the next heading. (Contents
# lists need no skipping: their rows are dropped line by line, and a skip could run on.)
_SKIP_SECTION = re.compile(
    r"(?:preface|introduction|introductory note|foreword|suggestions to teachers|(?:notes? )?to (?:the )?teachers?"
    r"|notes? (?:to|for) (?:the )?teachers?|acknowledge?ments?|transcriber'?s? notes?|articulation"
    r"|punctuation(?: marks)?|introductory matter|table of .*|(?:long |short |elementary )?sounds)",
    re.IGNORECASE,
)
# End matter: everything after this heading is dropped.
_END_SECTION = re.compile(
    r"(?:vocabulary(?: of .*)?|word lists?|phonetic tables?|phonics|index|glossary|appendix)",
    re.IGNORECASE,
)
_LESSON = re.compile(r"^(?:lesson|lesson\s+the)\s+[0-9ivxlc]+\b.*$", re.IGNORECASE)
_PAGE_NUMBER = re.compile(r"^[(\[{]?\s*(?:[0-9]+|[ivxlcdm]+)\s*[)\]}]?\.?$", re.IGNORECASE)
_CONTENTS_ROW = re.compile(r"\S\s{2,}(?:[0-9ivxlc]+(?:,\s*[0-9]+)*)$", re.IGNORECASE)
_WIDE_GAP = re.compile(r"\S\s{2,}\S")
_NO_SENTENCE_PUNCT = re.compile(r"^[^.!?,;:\"]*$")
_FRONT_LINE = re.compile(
    r"^(?:[0-9]{4},? by\b|copyright|all rights reserved|produced by|illustrat(?:ed|ions) by|with illustrations"
    r"|published by|printed in|author of|by(?:$|\s+[A-Z])|the authors? and publishers?|one shilling)"
    r"|&\s*(?:co|sons|company)\b|\b[A-Z]{2,}\s+CO\.|\bsuperintendent of\b",
    re.IGNORECASE,
)
# "Stanton, Michigan, April 8th, 1897." under a preface
_DATE_LINE = re.compile(r"^(?:\S+\s+){0,7}[0-9]{4}\.?$")
_ADVERT = re.compile(
    r"\$\s?\d|\d+\s+(?:[A-Z][a-z]+\s+)+\d+(?:st|nd|rd|th|d)\s+St(?:reet|\.)|\bpost-?paid\b|\b\d+mo\b|\bpublishers?\b\s*,|\bbound in cloth\b|\"\s*—\s*[A-Z][^\"]{0,60}\.$"
)
_PARAGRAPH_NUMBER = re.compile(r"^(?:[0-9]+|[IVXL]+)\.\s+(?=\S)")
_INLINE_NUMBER = re.compile(r"(?<=[.!?\"']) (?:[0-9]+[.,]|[IVXL]+\.) (?=[\"'A-Z])")
# "THE rats and the mice", "FRISKY SQUIRREL was": drop-cap openings in small capitals
_CAPS_OPENING = re.compile(r"^((?:[A-Z][A-Z']+)(?: [A-Z][A-Z']*)*)(?= [a-z])")
_ALPHA_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")


def _normalise(text: str) -> str:
    """NFKC, straight quotes, one dash style (an em dash without spaces), LF line ends."""
    text = unicodedata.normalize("NFKC", text).replace("\ufeff", "")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.translate(_QUOTES)
    return text


def _strip_pg_boilerplate(text: str) -> str:
    """The book body between PG's START and END markers (the whole text if there are none)."""
    if start := _PG_START.search(text):
        text = text[start.end():]
    if end := _PG_END.search(text):
        text = text[: end.start()]
    return text


def _remove_brackets(text: str) -> str:
    """Drop [Illustration: ...], [Script: ...], [Transcriber's Note ...] etc., even multi-line."""
    # "[Illustration: PREFACE]" stands for a heading: keep the word so the section is skipped.
    text = _BRACKET_HEADING.sub(
        lambda m: f"\n\n{m.group(1)}\n\n" if _SKIP_SECTION.fullmatch(m.group(1).strip()) else m.group(0), text
    )
    while True:
        new = _BRACKETS.sub(" ", text)
        if new == text:
            return text
        text = new


def _is_heading(lines: list[str]) -> bool:
    """A one-line paragraph that reads like a heading (no lowercase, or short and unpunctuated)."""
    if not any(re.search(r"[a-z]{2}", line) for line in lines):
        return True
    if len(lines) != 1:
        return False
    line = lines[0]
    return len(line.split()) <= 10 and bool(re.search(r"[A-Za-z0-9)]$", line))


def _keep_line(line: str) -> bool:
    """False for lesson headings, word lists, page numbers, contents rows and headings."""
    if not re.search(r"[a-z]{2}", line):  # all-caps headings, numbers, alphabets, "No. 5. TITLE"
        return False
    if _LESSON.match(line) or _PAGE_NUMBER.match(line) or _DATE_LINE.match(line):
        return False
    words = line.split()
    if len(words) >= 2 and 2 * sum(1 for w in words if re.fullmatch(r"[A-Z][A-Z'.,-]+", w)) >= len(words):
        return False
    if _CONTENTS_ROW.search(line):
        return False
    # word lists and phonics keys: words separated by runs of spaces, no sentence punctuation
    if _WIDE_GAP.search(line) and _NO_SENTENCE_PUNCT.match(line):
        return False
    return True


def _is_list(lines: list[str]) -> bool:
    """A block of four or more lines that are mostly unpunctuated: a contents or word list."""
    if len(lines) < 4:
        return False
    punctuated = sum(1 for line in lines if re.search(r"[.,;:!?\"']", line))
    return punctuated < len(lines) / 4


def _paragraph_blocks(text: str) -> Iterable[list[str]]:
    """Blank-line separated blocks, each a list of stripped, markup-free non-empty lines."""
    for block in re.split(r"\n[ \t]*\n", text):
        lines = [_MARKUP.sub("", raw).rstrip() for raw in block.split("\n")]
        lines = [line.strip() for line in lines if line.strip()]
        # keep inner runs of spaces (word lists are recognised by them); drop the indent
        if lines:
            yield lines


def clean_gutenberg(text: str) -> list[str]:
    """Clean paragraphs of prose from a Project Gutenberg book.

    Removes the PG header/footer (if present), bracket blocks ([Illustration...],
    [Script: ...], [Transcriber's Note...]), front matter (preface, introduction,
    contents, suggestions to teachers...), appendices (vocabulary, word lists, phonetic
    tables: dropped to the end of the book, once some prose was kept: before it, such a heading is
    a row of the contents list), lesson headings, word lists and phonics keys,
    page numbers, all-caps headings, lines with no lowercase letter, ``_ * ~`` markup and
    publishers' advertisements. Hard-wrapped lines are re-joined into one line per
    paragraph; Unicode is NFKC-normalised, quotes are straight and ``--`` becomes an em
    dash ("—") with no spaces around it. Paragraphs without sentence punctuation (titles,
    lists) are dropped.
    """
    text = _remove_brackets(_strip_pg_boilerplate(_normalise(text)))
    paragraphs: list[str] = []
    skipping = False
    for lines in _paragraph_blocks(text):
        if _is_heading(lines):
            heading = re.sub(r"\s+", " ", lines[0]).strip(" .:")
            if _END_SECTION.fullmatch(heading) and paragraphs:  # before any prose: a contents list's row
                break
            skipping = bool(_SKIP_SECTION.fullmatch(heading))
            continue
        if skipping:
            continue
        if _FRONT_LINE.search(lines[0]) or any(_FRONT_LINE.search(line) for line in lines if "&" in line):
            continue  # a title-page block: author, publisher, copyright
        kept = [_PARAGRAPH_NUMBER.sub("", line) for line in lines if _keep_line(line)]
        if not kept or _is_list(kept):
            continue
        paragraph = " ".join(kept)
        paragraph = _DASHES.sub("\u2014", paragraph)
        paragraph = _INLINE_NUMBER.sub(" ", paragraph)
        paragraph = _CAPS_OPENING.sub(lambda m: " ".join(w.capitalize() for w in m.group(1).split()), paragraph)
        paragraph = re.sub(r"\s+", " ", paragraph).strip()
        paragraph = re.sub(r"\s+([,.;:!?])", r"\1", paragraph)
        if not re.search(r"[a-z]", paragraph) or not _SENTENCE_END.search(paragraph):
            continue
        if _ADVERT.search(paragraph):
            continue
        paragraphs.append(paragraph)
    return paragraphs


# --------------------------------------------------------------------------- sentences

_SEGMENTER = None
_TERMINALS = re.compile(r"[.!?\u2014;:]+")


def _segmenter():
    global _SEGMENTER
    if _SEGMENTER is None:
        _SEGMENTER = pysbd.Segmenter(language="en", clean=False)
    return _SEGMENTER


def alpha_words(sentence: str) -> int:
    """The number of alphabetic words (``don't`` counts once) in `sentence`."""
    return len(_ALPHA_WORD.findall(sentence))


def split_sentences(paragraphs: list[str], *, min_words: int = 3, max_words: int = 60) -> list[str]:
    """Sentences of `paragraphs`, split with pysbd, stripped, in order.

    Fragments with fewer than `min_words` alphabetic words (or no letter at all) are dropped,
    and so are sentences longer than `max_words` whitespace-separated words (run-on verse).
    """
    segmenter = _segmenter()
    sentences: list[str] = []
    for paragraph in paragraphs:
        # pysbd is slow; a paragraph with one sentence end (at its end) needs no segmenting
        pieces = [paragraph] if len(_TERMINALS.findall(paragraph)) <= 1 else segmenter.segment(paragraph)
        for sentence in pieces:
            sentence = re.sub(r"\s+", " ", sentence).strip()
            if not sentence or not re.search(r"[A-Za-z]", sentence):
                continue
            if alpha_words(sentence) < min_words or len(sentence.split()) > max_words:
                continue
            sentences.append(sentence)
    return sentences


def _check_fractions(val_fraction: float, test_fraction: float) -> None:
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise GrowlmError(
            f"corpus val_fraction={val_fraction} and test_fraction={test_fraction} must be in [0, 1) "
            "and sum to less than 1"
        )


def unit_digest(unit: str) -> bytes:
    """The SHA-256 of a unit's text: its split (`split_of_digest`) and its identity when a level
    drops repeats (`growlm.prepare`) both come from it."""
    return hashlib.sha256(unit.encode("utf-8")).digest()


def split_of_digest(digest: bytes, val_fraction: float, test_fraction: float) -> str:
    """`split_of` from a unit's `unit_digest`."""
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + val_fraction:
        return "val"
    return "train"


def split_of(sentence: str, val_fraction: float, test_fraction: float) -> str:
    """"train", "val" or "test" for `sentence`, from a SHA-256 of its text alone.

    The hash maps the sentence to a number u in [0, 1): u < test_fraction is "test",
    u < test_fraction + val_fraction is "val", the rest "train". It does not depend on any
    other sentence, so adding a source never moves existing sentences.
    """
    _check_fractions(val_fraction, test_fraction)
    return split_of_digest(unit_digest(sentence), val_fraction, test_fraction)


# --------------------------------------------------------------------------- other kinds of text

_SPACES = re.compile(r"[ \t\f\v]+")


def clean_document(text: str) -> list[str]:
    """A document that is already prose (TinyStories, BabyLM, your own texts): NFKC, straight quotes,
    runs of spaces collapsed; its non-empty lines are its paragraphs. No Gutenberg heuristics."""
    lines = (_SPACES.sub(" ", line).strip() for line in _normalise(text).split("\n"))
    return [line for line in lines if line]


def units(document: str, settings: dict) -> list[str]:
    """What one document contributes to the corpus, one line each: its sentences (`sentences:
    true`) or the whole document on one line, after its source's cleaner (`clean`):

    - ``gutenberg``: `clean_gutenberg` (a Project Gutenberg book);
    - ``documents``: `clean_document`;
    - ``none``: the text as it is, its line breaks turned into spaces (a unit is one line).

    Units with fewer than `min_words` alphabetic words are dropped, and sentences longer than
    `max_words` (whole documents are not cut or dropped for their length)."""
    return [unit for unit, _ in counted_units(document, settings)]


def counted_units(document: str, settings: dict) -> list[tuple[str, tuple[int, int, int]]]:
    """`units`, each with its `unit_counts` (counted once: they also decide `min_words`)."""
    clean = settings["clean"]
    if clean == "gutenberg":
        paragraphs = clean_gutenberg(document)
    elif clean == "documents":
        paragraphs = clean_document(document)
    elif clean == "none":
        paragraphs = [" ".join(document.split("\n")).strip()]
    else:
        raise GrowlmError(f"unknown clean mode {clean!r}; use gutenberg, documents or none")
    min_words = settings["min_words"]
    if settings["sentences"]:
        found = split_sentences(paragraphs, min_words=min_words, max_words=settings["max_words"])
    elif clean == "gutenberg":  # paragraphs of a book, each its own unit
        found = paragraphs
    else:
        found = [" ".join(paragraphs).strip()]
    counted = ((unit, unit_counts(unit)) for unit in found if unit)
    return [(unit, counts) for unit, counts in counted if counts[0] >= min_words]


# --------------------------------------------------------------------------- levels

_PYPHEN = None


@functools.lru_cache(maxsize=1 << 17)
def syllables(word: str) -> int:
    """Syllables of a lower-case word from pyphen's English hyphenation dictionary (at least one)."""
    global _PYPHEN
    if _PYPHEN is None:
        _PYPHEN = pyphen.Pyphen(lang="en_US")
    return max(1, len(_PYPHEN.positions(word)) + 1)


_FK_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


@functools.lru_cache(maxsize=1 << 17)
def _word_syllables(word: str) -> int:
    return syllables(word.lower())


def unit_counts(unit: str) -> tuple[int, int, int]:
    """(alphabetic words, Flesch-Kincaid words, syllables) of one unit: what a level's statistics
    sum over the units it keeps."""
    fk = _FK_WORD.findall(unit)
    return len(_ALPHA_WORD.findall(unit)), len(fk), sum(map(_word_syllables, fk))


def grade(sentences: int, fk_words: int, total_syllables: int) -> float:
    """The Flesch-Kincaid grade from counts (`flesch_kincaid_grade` of the sentences counted)."""
    if not sentences or not fk_words:
        return 0.0
    return 0.39 * fk_words / sentences + 11.8 * total_syllables / fk_words - 15.59


def flesch_kincaid_grade(sentences: list[str]) -> float:
    """Flesch-Kincaid grade 0.39 w/s + 11.8 syl/w - 15.59, syllables from pyphen's English
    hyphenation dictionary (what textstat 0.7.3 did; newer textstat downloads cmudict at run time)."""
    words = [w for s in sentences for w in _FK_WORD.findall(s)]
    return grade(len(sentences), len(words), sum(map(_word_syllables, words)))


def reading_grade(document: str, settings: dict) -> float:
    """The Flesch-Kincaid grade (`grade`) of the sentences a document contributes to the corpus: its
    source's cleaner and `min_words`/`max_words` (`settings`, growlm.sources.settings_of), cut into
    sentences whatever the source's `sentences` says, so that a book's grade is the one a level of
    that book alone reports (`level_statistics`). How growlm ranks books by difficulty: the overlay
    config/children-large.yaml puts a book on its easy level by this grade (docs/corpus.md)."""
    counted = counted_units(document, {**settings, "sentences": True})
    return grade(len(counted), sum(c[1] for _, c in counted), sum(c[2] for _, c in counted))


def level_statistics(sentences: list[str]) -> dict:
    """Sentence and word counts, mean words per sentence and Flesch–Kincaid grade."""

    words = sum(alpha_words(s) for s in sentences)
    return {
        "sentences": len(sentences),
        "words": words,
        "mean_sentence_words": round(words / len(sentences), 3) if sentences else 0.0,
        "flesch_kincaid_grade": round(flesch_kincaid_grade(sentences), 3)
        if sentences
        else 0.0,
    }
