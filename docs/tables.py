"""Write the generated tables of the docs from the code that they describe.

    .venv/bin/python docs/tables.py            # rewrite them in place
    .venv/bin/python docs/tables.py --check    # exit 1, naming the tables, when one is out of date

A generated table stands between `<!-- table: NAME ... -->` and `<!-- end table: NAME -->` in a docs page;
`TABLES` says which function renders it. Edit the descriptions (`growlm.methods.OPERATORS`: an operator's
`summary`, options, ...), never the table; tests/test_docs.py fails while a table differs from its render.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "workflow" / "scripts"))  # this clone's growlm, whatever is installed

from growlm.methods import method_table, schedule_table  # noqa: E402
from growlm.recipes import recipe_table  # noqa: E402

COMMAND = ".venv/bin/python docs/tables.py"
TABLES = {  # (page, table name): renderer
    ("methods.md", "growth"): lambda: method_table(),
    ("methods.md", "refine"): lambda: method_table(refine=True),
    ("methods.md", "schedules"): lambda: schedule_table(),
    ("methods.md", "recipes"): lambda: recipe_table(),
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(^<!-- table: {name}\b.*?-->\n)(.*?)(^<!-- end table: {name} -->$)", re.M | re.S)


def rendered(page: str, text: str) -> str:
    """`text` (the page `page`) with each of its generated tables rendered anew."""
    for (where, name), render in TABLES.items():
        if where != page:
            continue
        pattern = _block(name)
        if not pattern.search(text):
            raise SystemExit(f"docs/{page} has no '<!-- table: {name} ... -->' ... '<!-- end table: {name} -->'")
        text = pattern.sub(lambda m: m.group(1) + render() + m.group(3), text, count=1)
    return text


def main(argv: list[str]) -> int:
    stale = []
    for page in sorted({page for page, _ in TABLES}):
        path = DOCS / page
        text = path.read_text()
        new = rendered(page, text)
        if new != text:
            stale.append(f"docs/{page}")
            if "--check" not in argv:
                path.write_text(new)
    if stale and "--check" in argv:
        print(f"out of date: {', '.join(stale)}; run {COMMAND}")
        return 1
    print(f"{'rewrote' if stale else 'up to date'}: {', '.join(stale) or ', '.join(sorted({f'docs/{p}' for p, _ in TABLES}))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
