"""Write every table and headline number of bench/RESULTS.md and of the README's answer from the files that hold them.

    .venv/bin/python bench/render_results.py            # rewrite the rendered blocks in place
    .venv/bin/python bench/render_results.py --check    # write nothing; exit 1, naming each block that differs from its data
    .venv/bin/python bench/render_results.py --help     # the usage; writes nothing (an unknown argument is refused)

A rendered block stands between `<!-- render: NAME ... -->` and `<!-- end render: NAME -->` in a page; the
opening line names the files it is rendered from. The data are the benchmarks' CSV files in `bench/results/`
(what `bench/savings.py`, `bench/budgets.py`, ... wrote), `bench/published.csv` (the figures the papers report,
with where each one stands) and, for parameter counts, the benchmarks' config files read through
`growlm.shape.ModelShape`. The first line of bench/RESULTS.md (the machine-readable `headline: ...`) is rendered
too. Edit a CSV or the function that renders a block, never the block: tests/test_results_rendered.py fails
while a block differs from its render, and while a figure in the prose around the blocks is not the one its
data give (bench/rendering/ties.py).

The blocks are rendered by the package `bench/rendering/`: `core` (the registry, how a source is read, the
formatting, parameter counts, `sentence`), one module per section's data (`answer`, `per_parameter`,
`savings`, `throughput`, `gpu`, `combine`, `scaling`, `budgets`, `recipes`, `families`, `modes`,
`schedules`, `readings`, `times`, `multiplier`, `ladder`) and the sentences in `templates/*.md.j2` (Jinja2). This script imports
them, holds section 15's blocks, and writes the pages.

A section's block from a new CSV:

1. put the CSV in bench/results/ (the benchmark's `--out`);
2. write its sentences as `bench/rendering/templates/<name>.md.j2` (a Jinja2 template, wrapped as you like: each
   paragraph is joined into one line; filters `f3`, `pm`, `tok`, `rate`, `pct`, `arm`, `reached`, `fmt`);
3. write the function in a module `bench/rendering/<section>.py`, decorated
   `@block("name", "bench/RESULTS.md", "your_file.csv", ...)`: it receives one DataFrame per file (the parsed
   mapping for a YAML config), in that order, and returns the Markdown, `table(header, rows)` for a table and
   `sentence("name", **values)` for the template;
4. add the module to the import line below, put the two marker lines `<!-- render: name -->` and
   `<!-- end render: name -->` where the block goes, and run this script.

tests/test_results_rendered.py picks the block up by itself: it checks that the page holds its render and that
every CSV it names feeds it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the package `rendering`
from rendering.core import (  # noqa: E402  the registry, formatting and parameter counts
    BLOCKS, Block, COMMAND, DATA, README_PAGE, REPO, RESULTS_PAGE, arm, block, f3, load, pm, render_block, source_path, table,
    tok, tpp)
from rendering import (  # noqa: E402,F401  (each registers its section's blocks)
    answer, budgets, combine, families, gpu, ladder, modes, multiplier, per_parameter, readings, recipes, savings,
    scaling, schedules, throughput, times)
from rendering.answer import HEADLINE_SOURCES, headline_line  # noqa: E402

REEXPORTED = (Block, DATA, README_PAGE, arm, source_path)  # read by tests/test_results_rendered.py through this module

# ---------------------------------------------------------------------------------------------
# section 15: the cost by envelope (bench/envelope.py)
# ---------------------------------------------------------------------------------------------

def _envelope_budgets(df: pd.DataFrame) -> list[int]:
    """The budgets of envelope_table.csv, the longest first."""
    return sorted({int(b) for b in df["budget"]}, reverse=True)


def _budget_cell(r: pd.Series) -> str:
    return f"{tok(r['budget'])} ({tpp(r['tokens_per_param'])}; {r['m0_passes']:.1f} passes)"


def _best_lever(df: pd.DataFrame, budget: int) -> pd.Series:
    """The lever (an arm other than plain `msg`) with the lowest mean cost ratio by envelope (members counted)
    at a budget, among those that reached M_0's loss on every seed they ran and ran the most seeds (a mean
    over three seeds before one seed's number)."""
    rows = df[(df["budget"] == budget) & (df["reached_by_envelope"] == df["seeds"]) & (df["arm"] != "msg")]
    rows = rows.assign(_most=-rows["seeds"])
    return rows.sort_values(["_most", "envelope_ratio"]).iloc[0]


@block("envelope", RESULTS_PAGE, "envelope_table.csv")
def envelope_table(df) -> str:
    header = ["M_0's tokens (per non-embedding parameter; passes over its text)", "arm", "members' FLOPs / M_0's",
              "seeds reached (envelope)", "cost ratio by envelope, members counted", "members free",
              "within one schedule, counted", "members free", "M_0 final loss", "M_1 final loss"]
    rows = []
    for budget in _envelope_budgets(df):
        for _, r in df[df["budget"] == budget].iterrows():
            rows.append([_budget_cell(r), r["arm"], f"{r['small_flops_share']:.3f}",
                         f"{int(r['reached_by_envelope'])}/{int(r['seeds'])}",
                         pm(r["envelope_ratio"], r["envelope_ratio_std"]), f3(r["envelope_ratio_small_free"]),
                         pm(r["cost_ratio"], r["cost_ratio_std"]), f3(r["cost_ratio_small_free"]),
                         f3(r["m0_final_val_loss"]), f3(r["m1_final_val_loss"])])
    return table(header, rows)


@block("envelope-tuning", RESULTS_PAGE, "envelope_m0_tuning.csv")
def envelope_tuning(tuning) -> str:
    header = ["M_0's tokens", "weight decay", "seed", "final loss", "branch 0.2", "branch 0.35", "branch 0.5",
              "branch 0.7"]
    rows = []
    for _, r in tuning.sort_values(["budget", "weight_decay", "seed"], ascending=[False, True, True]).iterrows():
        rows.append([tok(r["budget"]), f"{r['weight_decay']:g}", int(r["seed"]), f3(r["final_val_loss"]),
                     *(f3(r[f"branch_{p}_loss"]) for p in ("20", "35", "50", "70"))])
    return table(header, rows)


# ---------------------------------------------------------------------------------------------
# the pages
# ---------------------------------------------------------------------------------------------

def _pattern(name: str) -> re.Pattern:
    """A block's markers; in a YAML file they and the block are comments (`# ` after the indentation)."""
    return re.compile(rf"^(?P<prefix>[ ]*(?:# )?)<!-- render: {re.escape(name)} .*?"
                      rf"^(?P=prefix)<!-- end render: {re.escape(name)} -->$", re.M | re.S)


def _commented(prefix: str, block_text: str) -> str:
    return "\n".join(prefix + line if line else prefix.rstrip() for line in block_text.split("\n"))


def rendered(page: str, text: str, data: dict | None = None) -> str:
    """`text` (the page `page`, relative to the repository) with each of its blocks rendered anew."""
    for b in BLOCKS.values():
        if b.page != page:
            continue
        pattern = _pattern(b.name)
        if not pattern.search(text):
            raise SystemExit(f"{page} has no '<!-- render: {b.name} ... -->' ... '<!-- end render: {b.name} -->'")
        new = render_block(b, data)
        text = pattern.sub(lambda m: _commented(m.group("prefix"), new), text, count=1)
    if page == RESULTS_PAGE:
        frames = [(data or {}).get(s) if data and s in data else load(s) for s in HEADLINE_SOURCES]
        first, _, rest = text.partition("\n")
        text = headline_line(frames) + "\n" + rest
    return text


def blocks_of(text: str) -> dict[str, str]:
    """The rendered blocks of a page, by name."""
    return {m.group(1): m.group(0) for m in
            re.finditer(r"^[ ]*(?:# )?<!-- render: (\S+) .*?^[ ]*(?:# )?<!-- end render: \1 -->$", text, re.M | re.S)}


def parse_args(argv: list[str]):
    """The command line: no argument rewrites the stale blocks, `--check` only names them. argparse refuses an
    unknown argument (exit 2, before any page is read), and `--help` prints the usage and exits: neither
    writes a page, which a bare `sys.argv` test did (a typo rewrote the pages in place)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="bench/render_results.py",
        description="Render every table and headline number of bench/RESULTS.md and of the README's answer from "
                    "the CSV files in bench/results/ (and the configs and bench/published.csv they name).")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each page and block that differs from its data "
                             "(what the tests and CI run)")
    return parser.parse_args(argv)


def main(argv: list[str], root: Path = REPO) -> int:
    """Render the pages under `root` (the repository; a copy of its pages in the tests) from this clone's data."""
    args = parse_args(argv)
    stale = []
    for page in sorted({b.page for b in BLOCKS.values()}):
        path = root / page
        text = path.read_text()
        new = rendered(page, text)
        if new != text:
            old_blocks, new_blocks = blocks_of(text), blocks_of(new)
            names = [n for n in new_blocks if old_blocks.get(n) != new_blocks[n]]
            if text.partition("\n")[0] != new.partition("\n")[0]:
                names.insert(0, "the headline line")
            stale.append(f"{page} ({', '.join(names)})")
            if not args.check:
                path.write_text(new)
    if stale and args.check:
        print(f"differ from their data: {'; '.join(stale)}; run {COMMAND}")
        return 1
    print(f"{'rewrote' if stale else 'up to date'}: {'; '.join(stale) or ', '.join(sorted({b.page for b in BLOCKS.values()}))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
