"""The config files as written, checked before Snakemake's reading of them can go silently wrong.

Snakemake reads a config file as JSON, else as YAML, and both keep the last of a key given twice in one
mapping without a word: `schedule: cosine` and, lines below under the same `train:`, `schedule: wsd` run
wsd, and whoever reads the file sees cosine first. A file YAML cannot read (a tab where indentation goes)
stops Snakemake with "not valid JSON or YAML", naming neither the file nor the line. `config_file_problem`
says either in one line with the file, the line and the key's path.

Torch-free and Snakemake-free, with nothing of growlm below it: the Snakefile checks growlm's
config/config.yaml and every `--configfile` with it before its `configfile:` directive reads them, and the
workflow profile checks the `--configfile` files first (Snakemake reads those before the Snakefile).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

_MERGE = "tag:yaml.org,2002:merge"  # `<<: *anchor` merges a mapping in: its keys may be overridden, not repeated


def _dotted(path: tuple) -> str:
    return "".join(p if p.startswith("[") else f".{p}" for p in path).lstrip(".")


def _twice(node, path: tuple = ()):
    """(key path, first line, second line) of each key given twice in one mapping of a composed YAML node."""
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE:
                here = (*path, key.value)
                line = key.start_mark.line + 1
                if (key.tag, key.value) in seen:
                    yield here, seen[key.tag, key.value], line
                seen.setdefault((key.tag, key.value), line)
                yield from _twice(value, here)
            else:
                yield from _twice(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _twice(item, (*path, f"[{i}]"))


def _json_twice(text: str) -> str | None:
    """The first key given twice in one object of a JSON text (None: none, or not JSON)."""
    found = []

    def pairs(items):
        keys = [k for k, _ in items]
        found.extend(k for i, k in enumerate(keys) if k in keys[:i])
        return dict(items)

    try:
        json.loads(text, object_pairs_hook=pairs)
    except ValueError:
        return None
    return found[0] if found else None


def _yaml_error(err: yaml.YAMLError) -> str:
    """A YAML reader's error as its line, column and problem in words."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(err, "problem", None) or str(err)
    if "'\\t'" in problem:
        return f"{where}a tab, which YAML does not take where indentation goes: indent with spaces"
    context = getattr(err, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "") + ", so it is not valid YAML"


def config_file_problem(path: str | Path) -> str | None:
    """Why the config file `path` would not be read as written, in one line naming it and the line (None: it
    would): a key given twice in one mapping, or text that is neither JSON nor YAML. A missing file is left to
    Snakemake, which names it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        node, problem = None, _yaml_error(err)
    else:
        problem = None
    for key, first, again in _twice(node):
        return (f"{path}, line {again}: {_dotted(key)} is given a second time (first on line {first}); a config "
                f"file's reader keeps the last without a word: keep one")
    twice = _json_twice(text)  # JSON, which Snakemake reads first, may hold what YAML cannot (a tab)
    if twice is not None:
        return f"{path}: key {twice!r} is given twice in one object; JSON's reader keeps the last without a word"
    if problem:
        try:
            json.loads(text)
        except ValueError:
            return f"{path}, {problem}"
    return None


def command_line_configfiles(argv: list[str]) -> list[str]:
    """The files a Snakemake command line names with `--configfile` / `--configfiles` (several may follow
    one option, up to the next option)."""
    files, i = [], 1
    while i < len(argv):
        word = argv[i]
        i += 1
        name, eq, inline = word.partition("=")
        if name not in ("--configfile", "--configfiles"):
            continue
        if eq:
            files.append(inline)
            continue
        while i < len(argv) and not argv[i].startswith("-"):
            files.append(argv[i])
            i += 1
    return files
