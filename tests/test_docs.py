"""The README is a front door and docs/ the manual; neither can drift from the code or from each other.

The operator tables of docs/methods.md are `growlm.methods.method_table()`'s render of the operators'
descriptions (`.venv/bin/python docs/tables.py` writes them); every relative link of the README, the
manual, CONTRIBUTING.md, config/README.md and bench/*.md names a file that exists and, with an anchor, a
heading of that file; every ```yaml snippet of those pages is valid config on top of config/config.yaml.
(tests/test_readme.py runs the pages' commands, tests/test_layers.py checks the layering of
docs/architecture.md, tests/test_combine.py the tutorial of docs/methods.md.)
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from growlm.methods import OPERATORS, REFINE, method_table, schedule_table

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "config" / "README.md", *sorted(DOCS.glob("*.md")),
         *sorted((REPO / "bench").glob("*.md"))]


def _tables():
    spec = importlib.util.spec_from_file_location("growlm_docs_tables", DOCS / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_door():
    size = len((REPO / "README.md").read_bytes())
    assert size < 10 * 1024, f"README.md is {size} bytes; move the detail to a page of docs/ and link it"


@pytest.mark.parametrize("page", sorted({page for page, _ in _tables().TABLES}))
def test_the_generated_tables_are_up_to_date(page):
    tables = _tables()
    text = (DOCS / page).read_text()
    assert tables.rendered(page, text) == text, (
        f"a generated table of docs/{page} differs from its render of the code; run {tables.COMMAND} "
        f"(edit the descriptions in growlm.methods.OPERATORS, not the table)")


def test_the_method_tables_have_a_row_per_builtin_operator():
    builtin = [s for s in OPERATORS.values() if s.source == "growlm"]
    assert [s.name for s in builtin if s.axis == "schedule"] == [
        re.match(r"\| `([^`]+)` \|", row).group(1) for row in schedule_table().splitlines()[2:]]
    builtin = [s for s in builtin if s.axis != "schedule"]
    for refine in (False, True):
        rows = method_table(refine).splitlines()[2:]
        names = [re.match(r"\| `([^`]+)` \|", row).group(1) for row in rows]
        assert names == [s.name for s in builtin if (s.axis == REFINE) == refine]
    assert all(s.summary for s in builtin), [s.name for s in builtin if not s.summary]
    text = (DOCS / "methods.md").read_text()
    assert all(f"| `{s.name}` |" in text for s in builtin)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, seen = set(), {}
    for heading in re.findall(r"^#+ (.+)$", _unfenced(path.read_text()), flags=re.M):
        base = slug(heading)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def _unfenced(text: str) -> str:
    """Markdown without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _prose(text: str) -> str:
    """Markdown without its code, fenced or inline (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", _unfenced(text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def _deep_update(base: dict, over: dict) -> dict:
    """What Snakemake does with a second config file: nested mappings merge, everything else replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_update(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


YAML_BLOCKS = [(page, block) for page in PAGES
               for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S)]


@pytest.mark.parametrize("page,block", YAML_BLOCKS, ids=[f"{p.name}:{i}" for i, (p, _) in enumerate(YAML_BLOCKS)])
def test_every_config_snippet_of_the_manual_is_valid_config(page, block):
    """A snippet a reader copies into a config file, on top of config/config.yaml, passes the schema."""
    import yaml

    from growlm.config_values import schema_problems

    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    snippet = yaml.safe_load(block)
    assert isinstance(snippet, dict), f"{page.name}: a yaml block that is not a mapping of config keys"
    assert schema_problems(_deep_update(base, snippet), schema) == [], f"{page.name}:\n{block}"


SHARE_FILES = [*PAGES, *sorted((REPO / "config").glob("*.yaml")), *sorted((REPO / "profiles").glob("*/config.yaml")),
               *sorted((REPO / "bench").glob("*.yaml")), *sorted((REPO / "workflow" / "rules").glob("*.smk")),
               REPO / "workflow" / "schemas" / "config.schema.yaml",
               *sorted((REPO / "workflow" / "scripts" / "growlm").rglob("*.py"))]


def test_gpu_share_is_written_as_the_number_the_schema_takes_everywhere():
    """`gpu_share: 1/2` is a string to YAML and fails the schema: wherever growlm writes a value of it (a
    page, a config, a profile's comments, a docstring), the value is a number in (0, 1]."""
    wrong = []
    for path in SHARE_FILES:
        for value in re.findall(r"gpu_share`?(?::|=|\s)[ \t]*([0-9][^\s,;:)\]}`]*)", path.read_text()):
            try:
                ok = 0 < float(value) <= 1
            except ValueError:
                ok = False
            if not ok:
                wrong.append(f"{path.relative_to(REPO)}: gpu_share {value}")
    assert not wrong, "\n".join(wrong)
