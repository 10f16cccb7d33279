"""What every rendered block shares: the registry of blocks, how a source is found and read, the formatting of
a figure, parameter counts from the benchmarks' configs, and the sentence templates.

A section's data live in one small module of this package (`answer.py`, `savings.py`, ...): a function
decorated `@block(name, page, *sources)` receives one frame per source and returns the block's Markdown,
building it from tables (`table`) and from sentences held in `templates/` (`sentence(template, **values)`), so
a new section is a CSV, a template and a function (bench/README.md, "Rendering RESULTS.md", has an example).
`bench/render_results.py` imports every such module and writes the pages.

A source is read once per process (`load` caches it by path and modification time, and hands out a copy), so
rendering every block, or every block again from changed data as the tests do, reads each file once.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jinja2
import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "bench" / "results"
sys.path.insert(0, str(REPO / "workflow" / "scripts"))  # this clone's growlm, whatever is installed

COMMAND = ".venv/bin/python bench/render_results.py"
RESULTS_PAGE = "bench/RESULTS.md"
README_PAGE = "README.md"


@dataclass(frozen=True)
class Block:
    name: str
    page: str
    sources: tuple[str, ...]  # paths under bench/results/ (CSV), or from the repository root (bench/..., config/...)
    render: Callable[..., str]


BLOCKS: dict[str, Block] = {}


def block(name: str, page: str, *sources: str):
    def register(fn):
        old = BLOCKS.get(name)
        if old is not None and (old.render.__module__, old.render.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"two blocks named {name}")  # the same function registered again (a reload) replaces itself
        BLOCKS[name] = Block(name, page, sources, fn)
        return fn
    return register


def source_path(source: str) -> Path:
    return REPO / source if source.startswith(("bench/", "config/")) else DATA / source


_READ: dict = {}


def load(source: str):
    """A source's data: a DataFrame for a CSV, the parsed mapping for a YAML file.

    Each file is parsed once per process and version (its path and modification time are the key, so an edited
    file is read again) and every caller gets its own copy: a render function may change what it was given
    without changing what the next one reads. Rendering every block reads the same files many times over (the
    headline alone names 29); parsing them once is most of what a render of the pages costs."""
    path = source_path(source)
    key = (path, path.stat().st_mtime_ns)
    if key not in _READ:
        if path.suffix == ".csv":
            _READ[key] = pd.read_csv(path, dtype=str) if path.name.startswith("published") else pd.read_csv(path)
        else:
            _READ[key] = yaml.safe_load(path.read_text())
    data = _READ[key]
    return data.copy() if isinstance(data, pd.DataFrame) else copy.deepcopy(data)


def render_block(b: Block, data: dict | None = None) -> str:
    """The block's Markdown from its sources (`data`: source -> frame, to render from other data)."""
    frames = [(data or {}).get(s) if data and s in data else load(s) for s in b.sources]
    text = b.render(*frames).strip("\n")
    names = ", ".join(dict.fromkeys(str(source_path(s).relative_to(REPO)) for s in b.sources))
    return f"<!-- render: {b.name} from {names}; {COMMAND} writes this block -->\n{text}\n<!-- end render: {b.name} -->"


# ---------------------------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------------------------

def missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def f3(x, d: int = 3) -> str:
    return "-" if missing(x) else f"{float(x):.{d}f}"


def pm(mean, std, d: int = 3, one: str = " (one seed)") -> str:
    """mean ± standard deviation over seeds; one seed has no spread."""
    if missing(mean):
        return "-"
    if missing(std):
        return f"{float(mean):.{d}f}{one}"
    return f"{float(mean):.{d}f} ± {float(std):.{d}f}"


def tok(n) -> str:
    n = int(round(float(n)))
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


def rate(x) -> str:
    """A learning rate as the benchmarks write it: 8e-3, 1.6e-2."""
    mantissa, exponent = f"{float(x):.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def reached(row) -> str:
    return f"{int(row['reached'])}/{int(row['seeds'])}"


def count(n) -> str:
    return f"{int(n):,}"


def pct(x, d: int = 1) -> str:
    return f"{100 * float(x):.{d}f}%"


def arm(method: str) -> str:
    """A comparison's method as a table cell: `msg_members` + `carry`; a control grown from m_1 alone."""
    control = method.endswith("@m1")
    parts = method.removesuffix("@m1").split("+")
    cell = " + ".join(f"`{p}`" for p in parts)
    return f"control: {cell} from m_1 alone" if control else cell


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def row_of(df: pd.DataFrame, **match) -> pd.Series:
    """The one row of `df` whose columns equal `match`."""
    hit = df
    for k, v in match.items():
        hit = hit[hit[k] == v]
    if len(hit) != 1:
        raise KeyError(f"{len(hit)} rows with {match}")
    return hit.iloc[0]


def ratio_cells(r: pd.Series, mean="cost_ratio_mean", std="cost_ratio_std", free="cost_ratio_small_free_mean"):
    """reached, the cost ratio with the members counted (± sd), with them free."""
    return [reached(r), pm(r[mean], r[std]), f3(r[free])]


# ---------------------------------------------------------------------------------------------
# parameter counts, from the benchmarks' configs
# ---------------------------------------------------------------------------------------------

def _merged(*configs: dict) -> dict:
    out: dict = {}
    for c in configs:
        for k, v in c.items():
            out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def m0_params(config: dict, d1: int | None = None, family: str | None = None) -> tuple[int, int]:
    """(non-embedding, total) parameters of M_0 under a merged config."""
    from growlm.shape import ModelShape

    model = config["model"]
    shape = ModelShape.of({"n_embd": d1 or config["d1"][0], "n_layer": config["L1"][0],
                           "head_dim": model["head_dim"], "vocab_size": config["tokenizer"]["vocab_size"],
                           "n_positions": model["context"], "family": family or model.get("family") or "gpt2",
                           "heads_per_kv": model.get("heads_per_kv"), "mlp_ratio": model.get("mlp_ratio")})
    return shape.n_params - shape.embedding_params, shape.n_params


def tpp(x: float) -> str:
    """Tokens per parameter: two significant digits, whole numbers from 10 on."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def per_param(tokens: int, params: tuple[int, int]) -> str:
    """Tokens per non-embedding parameter (per parameter)."""
    return f"{tpp(tokens / params[0])} ({tpp(tokens / params[1])})"


def millions(n: int) -> str:
    return f"{n / 1e6:.2f}M"


TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                               undefined=jinja2.StrictUndefined, keep_trailing_newline=False,
                               trim_blocks=True, lstrip_blocks=True)
TEMPLATES.filters.update(pm=pm, f3=f3, tok=tok, arm=arm, reached=reached, pct=pct, tpp=tpp, rate=rate,
                         millions=millions, count=count, fmt=format)  # fmt: `x | fmt(".2f")` is format(x, ".2f")


def sentence(name: str, **values) -> str:
    """The template `templates/<name>.md.j2` filled with `values`, its lines joined into one paragraph per blank
    line (a template is written wrapped, a block prints each paragraph on one line)."""
    text = TEMPLATES.get_template(f"{name}.md.j2").render(**values)
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(paragraphs)
