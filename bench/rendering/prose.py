"""The check that every measured figure in a page's prose is the one its data give.

A figure is a decimal (not a version such as 2.13.0, nor a rate such as 1.6e-2), a percentage, a time (s,
minutes, hours) or a count of seeds ("2 of 3 seeds", "2/3"). The prose is the page without its rendered
blocks, code, comments and link targets, its whitespace collapsed. Each figure must lie inside the text of a
tie (`ties.TIES`): a snippet of the page with `{}` where its figures stand, and a function that computes those
figures from the CSV cell, config value or citation they come from. A tie whose snippet, filled with the
computed figures, is not in the prose exactly as often as it says fails; so does a figure no tie covers.
"""

from __future__ import annotations

import re

FIGURE = re.compile(
    r"(?<![\w.\-/])(?:"
    r"\d+(?:\.\d+)?\s?%"                                          # a percentage
    r"|\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? (?:s|ms|minutes|hours?)\b"  # a time
    r"|\d+/\d+(?![\w/])"                                            # seeds reached, k/n
    r"|\d+ of \d+ seeds"                                            # seeds reached, in words
    r"|\d+\.\d+(?![\d.]|e-?\d)"                                     # a decimal
    r")")


def prose(text: str) -> str:
    """A page without its rendered blocks, code, comments and link targets, whitespace collapsed."""
    text = re.sub(r"^[ ]*(?:# )?<!-- render: (\S+) .*?^[ ]*(?:# )?<!-- end render: \1 -->$", "", text,
                  flags=re.M | re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    text = re.sub(r"^    .*$", "", text, flags=re.M)  # indented code
    text = re.sub(r"`[^`\n]*`", "``", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return " ".join(text.split())


def figures(text: str) -> list[re.Match]:
    """The figures of `text`, less versions (2.13.0), token counts (6.4M: a budget, a setting) and papers'
    arXiv numbers (their citations are bench/published.csv's)."""
    return [m for m in FIGURE.finditer(text)
            if not re.match(r"\d+\.\d+(?:\.\d|[Mk]\b)", text[m.start():m.end() + 3])
            and not text[:m.start()].endswith("arXiv ")]


def body(page: str, text: str, until: str | None = None) -> str:
    """The prose of a page (RESULTS.md without its machine-read first line), up to the heading `until`."""
    text = text.split("\n", 1)[1] if page.endswith("RESULTS.md") else text
    return prose(text.split(until)[0] if until else text)


def problems(page: str, body: str, ties) -> list[str]:
    """What is wrong with the figures of a page's prose (`body`): ties whose filled snippet is not there as
    often as they say (a figure differs from its data) and figures that no tie covers."""
    out, covered = [], []
    for tie in ties:
        if tie.page != page:
            continue
        expected = tie.text()
        found = [m.span() for m in re.finditer(re.escape(expected), body)]
        if len(found) != tie.count:
            out.append(f"{page}: '{expected}' ({tie.source}) is in the prose {len(found)} times, not {tie.count}")
        covered += found
    for m in figures(body):
        if not any(a <= m.start() and m.end() <= b for a, b in covered):
            out.append(f"{page}: '{m.group()}' in '...{body[max(0, m.start() - 50):m.end() + 20]}...' is tied to "
                       f"no data (bench/rendering/ties.py)")
    return out
