"""Every table and headline number of bench/RESULTS.md and the README's answer is what its CSV gives.

`bench/render_results.py` renders each block between `<!-- render: NAME ... -->` and `<!-- end render: NAME -->`
from the files it names; these tests fail while a page's block differs from its render (a changed CSV, a
hand-edited number), show that every file a block names feeds it, check the first screen and the headline
against the CSVs read here on their own, and tie every figure of the prose around the blocks to its CSV cell,
config value or citation (bench/rendering/ties.py), with a mutation test that a changed digit fails.

The renderer reads each file once per process (`rendering.core.load`) and a block's render from the committed
data is made once per session (`_rendered_block`), so the many cases below cost little more than one render.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def _renderer():
    spec = importlib.util.spec_from_file_location("growlm_render_results", REPO / "bench" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


R = _renderer()
PAGES = sorted({b.page for b in R.BLOCKS.values()})


@pytest.mark.parametrize("page", PAGES)
def test_every_rendered_block_is_what_its_data_gives(page):
    text = (REPO / page).read_text()
    new = R.rendered(page, text)
    if new != text:
        old, fresh = R.blocks_of(text), R.blocks_of(new)
        stale = [n for n in fresh if old.get(n) != fresh[n]] or ["the headline line"]
        pytest.fail(f"{page}: {', '.join(stale)} differ from their data; run {R.COMMAND} (edit the CSV or the "
                    f"function that renders the block, never the block)")


def test_a_hand_edited_number_is_caught():
    page = R.RESULTS_PAGE
    text = (REPO / page).read_text()
    block = R.blocks_of(text)["answer"]
    edited_block = re.sub(r"\d\.\d{3}", lambda m: f"{float(m.group()) + 0.001:.3f}", block, count=1)
    assert edited_block != block
    edited = text.replace(block, edited_block)
    assert R.rendered(page, edited) == text  # the render puts the data's number back


# columns the renderer picks rows by (changing them would find no row, which also shows the file is read)
SELECTORS = {"budget", "d1", "d", "method", "family", "schedule", "m0_schedule", "mode", "compile", "arm", "key",
             "rule", "part", "model", "seed"}


def _changed_values(df: pd.DataFrame) -> pd.DataFrame:
    """The same rows with every value a block could quote changed: numbers moved, free text marked."""
    out = df.copy()
    for column in out.columns:
        if column in SELECTORS:
            continue
        if pd.api.types.is_float_dtype(out[column]):
            out[column] = out[column] * 0.5 + 0.0123
        elif pd.api.types.is_integer_dtype(out[column]):
            out[column] = out[column] * 2
        elif not pd.api.types.is_numeric_dtype(out[column]):
            out[column] = out[column].map(lambda v: v if not isinstance(v, str) else v + " (changed)")
    return out


@functools.cache
def _rendered_block(name: str) -> str:
    """A block rendered from the committed data, once per session (every file it names is a case below)."""
    return R.render_block(R.BLOCKS[name])


CASES = [(b.name, s) for b in R.BLOCKS.values() for s in dict.fromkeys(b.sources) if s.endswith(".csv")]


@pytest.mark.parametrize("name,source", CASES, ids=[f"{n}:{s}" for n, s in CASES])
def test_every_csv_a_block_names_feeds_it(name, source):
    """Changed values, or fewer rows, in any file a block names change the block or stop its render: the files
    a block names are the ones it is rendered from."""
    b = R.BLOCKS[name]
    before = _rendered_block(name)
    df = R.load(source)
    for changed in (_changed_values(df), df.head(1), df.head(0)):
        try:
            if R.render_block(b, {source: changed}) != before:
                return
        except (KeyError, IndexError, ValueError, TypeError):
            return
    pytest.fail(f"block {name} renders the same whatever {source} holds")


def _read(name: str) -> list[dict]:
    with open(RESULTS / name, newline="") as f:
        return list(csv.DictReader(f))


def _answer_rows() -> list[list[str]]:
    block = R.blocks_of((REPO / R.RESULTS_PAGE).read_text())["answer"]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines() if line.startswith("| ")][1:]


def _ratio(mean: str, std: str) -> str:
    return f"{float(mean):.3f} ± {float(std):.3f}"


def test_the_first_screen_gives_what_the_csvs_give():
    rows = _answer_rows()

    def find(*parts):
        hits = [r for r in rows if all(any(p == c or c.startswith(p) for c in r) for p in parts)]
        assert len(hits) == 1, (parts, hits)
        return hits[0]

    for r in _read("budgets_table.csv"):
        if r["method"] == "msg":
            budget = {"400000": "400k", "1600000": "1.6M", "6400000": "6.4M"}[r["budget"]]
            row = find(budget, "cosine", "`msg` (m_1)")
            assert row[5] == _ratio(r["cost_ratio"], r["cost_ratio_std"]) and row[6] == f"{float(r['small_free']):.3f}"
            assert row[4] == f"{r['reached']}/{r['seeds']}"
    for r in _read("savings_summary.csv"):
        if r["method"] == "msg" and r["budget"] in ("100000", "200000"):
            row = find({"100000": "100k", "200000": "200k"}[r["budget"]], "cosine")
            assert row[5] == _ratio(r["cost_ratio_mean"], r["cost_ratio_std"])
    for r in _read("schedules_table.csv"):
        if r["method"] == "msg" and r["schedule"] == "wsd" and r["m0_schedule"] == "wsd":
            row = find({"400000": "400k", "6400000": "6.4M"}[r["budget"]], "wsd")
            assert row[5] == _ratio(r["cost_ratio"], r["cost_ratio_std"])
    for r in _read("families_summary.csv"):
        if r["method"] in ("msg", "concat"):
            family = "GPT-2" if r["family"] == "gpt2" else "Llama"
            hits = [x for x in rows if family in x[0] and x[3].startswith(f"`{r['method']}`")]
            if hits:
                assert hits[0][5] == _ratio(r["cost_ratio"], r["cost_ratio_std"]), hits
    for r in _read("budgets_long_table.csv"):
        hits = [x for x in rows if x[1].startswith("25.6M") and x[3].startswith(R.arm(r["method"]))]
        assert len(hits) == 1 and hits[0][5] == _ratio(r["cost_ratio"], r["cost_ratio_std"])
        assert hits[0][4] == f"{r['reached']}/{r['seeds']}"


def test_the_headline_is_the_lowest_arm_that_reached_m0_on_every_seed():
    """Read here from every summary of bench/results/ that has the columns, whatever the renderer lists."""
    best = None
    for path in sorted(RESULTS.glob("*.csv")):
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if not {"method", "seeds", "reached", "cost_ratio_mean"} <= set(reader.fieldnames or []):
                continue
            for r in reader:
                if r["cost_ratio_mean"] and r["reached"] == r["seeds"] and int(r["seeds"]) >= 3:
                    if best is None or float(r["cost_ratio_mean"]) < best[0]:
                        best = (float(r["cost_ratio_mean"]), r["method"], r["seeds"])
    first = (REPO / R.RESULTS_PAGE).read_text().splitlines()[0]
    assert first == f"headline: cost_ratio={best[0]:.3f} method={best[1]} seeds={best[2]}"
    sentence = R.blocks_of((REPO / R.RESULTS_PAGE).read_text())["headline"]
    assert f"{best[0]:.3f}" in sentence and "a hint, not a finding" in sentence


NUMBER = re.compile(r"(?<![\w.])\d+\.\d{2,}(?![\d.])")


def _prose(text: str) -> str:
    """A page without its rendered blocks, code, comments and link targets: what a person wrote."""
    text = re.sub(r"^<!-- render: (\S+) .*?^<!-- end render: \1 -->$", "", text, flags=re.M | re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    text = re.sub(r"^    .*$", "", text, flags=re.M)  # indented code
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"arXiv\s+\d{4}\.\d{4,5}", "", text)  # a paper's number, not a figure
    return re.sub(r"\]\([^)]*\)", "]", text)


def _given(text: str) -> set[str]:
    """Every number the page's blocks give, as printed and rounded to two decimals."""
    numbers = set()
    for block in R.blocks_of(text).values():
        for n in NUMBER.findall(block.split("\n", 1)[1]):
            numbers |= {n, f"{float(n):.2f}"}
    return numbers


def test_section_15_and_the_readme_sentence_are_rendered_from_the_multiplier_table():
    """Section 15 (the effective compute multiplier, bench/multiplier.py), its line on the first screen and the
    README's sentence are blocks rendered from multiplier_table.csv, which names every arm at every budget measured;
    the first measurement's tables stay, rendered from their own CSVs."""
    import pandas as pd

    results, readme = (REPO / R.RESULTS_PAGE).read_text(), (REPO / R.README_PAGE).read_text()
    for name in ("multiplier", "multiplier-reading", "multiplier-answer", "envelope", "envelope-tuning"):
        assert f"<!-- render: {name} from" in results, name
    assert "<!-- render: readme-multiplier from bench/results/multiplier_table.csv" in readme
    section = results.split("## 15.")[1]
    for arm in pd.read_csv(R.DATA / "multiplier_table.csv")["arm"]:
        assert f"| {arm} |" in section, arm
    for arm in pd.read_csv(R.DATA / "envelope_table.csv")["arm"]:
        assert f"| {arm} |" in section, arm


def _stale_copy(tmp_path: Path) -> dict[Path, str]:
    """Copies of the rendered pages under tmp_path, RESULTS.md with one block hand-edited (stale)."""
    pages = {}
    for page in PAGES:
        text = (REPO / page).read_text()
        if page == R.RESULTS_PAGE:
            text = text.replace("| 64 x 4 (0.34M / 0.20M) | 100k (0.5) |", "| 64 x 4 (0.34M / 0.20M) | 100k (9.5) |", 1)
            assert text != (REPO / page).read_text()
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text(text)
        pages[tmp_path / page] = text
    return pages


def test_the_command_line_writes_only_when_asked(tmp_path, capsys):
    """`--help` prints the usage and writes nothing, an unknown argument is refused before any page is read,
    `--check` names the stale block and writes nothing; no argument rewrites it."""
    pages = _stale_copy(tmp_path)
    with pytest.raises(SystemExit) as e:
        R.main(["--help"], root=tmp_path)
    assert e.value.code == 0 and "--check" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        R.main(["--chek"], root=tmp_path)
    assert e.value.code == 2 and "unrecognized arguments: --chek" in capsys.readouterr().err
    assert R.main(["--check"], root=tmp_path) == 1
    assert "bench/RESULTS.md (answer)" in capsys.readouterr().out
    assert {p: p.read_text() for p in pages} == pages  # nothing written
    assert R.main([], root=tmp_path) == 0
    assert (tmp_path / R.RESULTS_PAGE).read_text() == (REPO / R.RESULTS_PAGE).read_text()
    assert R.main(["--check"], root=tmp_path) == 0


# Every page is checked whole (a page's prose up to a heading could be left out while its section is measured again).
UNTIL = {R.RESULTS_PAGE: None, R.README_PAGE: None}


def _prose_check():
    sys.path.insert(0, str(REPO / "bench"))
    from rendering import prose, ties
    return prose, ties


@pytest.mark.parametrize("page", sorted(UNTIL))
def test_every_figure_in_the_prose_is_its_data(page):
    """Every decimal, percentage, time and seed count in the prose is tied to the CSV cell, config value or
    stated goal it comes from (bench/rendering/ties.py), and equals it."""
    prose, ties = _prose_check()
    body = prose.body(page, (REPO / page).read_text(), UNTIL[page])
    assert prose.figures(body), page
    problems = prose.problems(page, body, ties.TIES)
    assert not problems, "\n".join(problems)


def test_a_changed_digit_in_the_prose_fails_the_check():
    """The last digit of each prose figure changed, one at a time (a seeded sample of 40), fails the check every
    time: a figure typed by hand cannot drift from its data unnoticed."""
    import random

    prose, ties = _prose_check()
    edits = []
    for page, until in UNTIL.items():
        body = prose.body(page, (REPO / page).read_text(), until)
        for m in prose.figures(body):
            last = max(i for i, c in enumerate(m.group()) if c.isdigit()) + m.start()
            digit = str((int(body[last]) + 1) % 10)
            edits.append((page, body[:last] + digit + body[last + 1:], m.group()))
    assert len(edits) > 20
    missed = [(page, figure) for page, body, figure in random.Random(58).sample(edits, min(40, len(edits)))
              if not prose.problems(page, body, ties.TIES)]
    assert not missed, f"changed figures the check did not catch: {missed}"
