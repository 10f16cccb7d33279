"""Where each figure of the prose (outside the rendered blocks) of bench/RESULTS.md and README.md comes from.

A tie is a snippet of the page's prose as `prose.prose` gives it (code spans as ``, whitespace collapsed) with
`{}` for its figures, and the function that computes them from their source: a CSV cell (`cell`), a config
value (`config`), or, for a goal or a requirement that is no measurement, the value as stated (`stated`, with
why). `prose.problems` fails while a filled snippet is not in the page as often as the tie says, or while a
figure lies outside every tie. A changed CSV cell or config value changes the expected text; a changed figure
in the page no longer matches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import pandas as pd
import yaml

from rendering.core import DATA, README_PAGE, REPO, RESULTS_PAGE


@dataclass(frozen=True)
class Tie:
    page: str
    snippet: str
    values: Callable[[], tuple]
    source: str
    count: int = 1

    def text(self) -> str:
        return self.snippet.format(*self.values())


@lru_cache(maxsize=None)
def csv(name: str) -> pd.DataFrame:
    return pd.read_csv(DATA / name)


def cell(name: str, column: str, fmt: str, **match):
    """The one row of bench/results/<name> matching `match`: its `column`, formatted."""
    def value():
        df = csv(name)
        for k, v in match.items():
            df = df[df[k] == v]
        if len(df) != 1:
            raise KeyError(f"{name}: {len(df)} rows with {match}")
        return format(df.iloc[0][column], fmt)
    return value


def config(path: str, keys: str, fmt: str = ""):
    def value():
        node = yaml.safe_load((REPO / path).read_text())
        for k in keys.split("."):
            node = node[k]
        return format(node, fmt)
    return value


def stated(value: str):
    return lambda: value


def tie(page, snippet, *values, source, count=1) -> Tie:
    return Tie(page, snippet, lambda: tuple(v() for v in values), source, count)


ENV = "envelope_table.csv"
TUNE = "envelope_m0_tuning.csv"
E = dict(budget=6400000)
S = dict(budget=1600000)
P = dict(budget=1749000)
R = RESULTS_PAGE


def env(column, fmt=".3f", **match):
    return cell(ENV, column, fmt, **match)


def csv_value(name, column, **match):
    df = csv(name)
    for k, v in match.items():
        df = df[df[k] == v]
    return df.iloc[0][column]


def wd(budget, decay):
    """M_0's final loss on seed 0 at a weight decay (envelope_m0_tuning.csv)."""
    return cell(TUNE, "final_val_loss", ".3f", budget=budget, weight_decay=decay, seed=0)


TIES = [
    # goals and requirements: no measurement, so their value is stated here
    tie(R, "the default run had to fit in {} minutes", stated("15"), source="the goal for the default run"),
    tie(R, "the effective compute multiplier with its {}% interval, read off", stated("95"),
        source="the interval's level (growlm.multiplier: arm_multiplier's level)"),
    tie(R, "each arm's effective compute multiplier with its {}% interval over seeds", stated("95"),
        source="the interval's level (growlm.multiplier: arm_multiplier's level)"),
    tie(R, "Each size's multiplier, members counted and free, with its {}% interval over seeds", stated("95"),
        source="the interval's level (growlm.multiplier: arm_multiplier's level)"),
    tie(R, "The goal of {}% MFU at d >= 768 was not met", stated("45"), source="the MFU goal (bench/README.md)"),
    tie(R, "The goal of {}% MFU at d >= 768 is not met", stated("45"), source="the MFU goal"),
    tie(R, "The goals ({} of M_0's rate during the ramp, {} after)", stated("0.85"), stated("0.95"),
        source="the refinement-speed goals"),
    tie(R, "refinement jobs within {}x M_0's job; {} of M_0's rate during the ramp and {} after",
        stated("1.3"), stated("0.85"), stated("0.95"), source="the refinement-speed goals"),
    tie(README_PAGE, "growlm needs Python {} or newer",
        lambda: (REPO / "pyproject.toml").read_text().split('requires-python = ">=')[1].split('"')[0],
        source="pyproject.toml's requires-python"),
    # section 4: the GPU check
    tie(R, "growlm's step runs at {}-{} of the reference's rate",
        lambda: f"{csv('gpu_check_h100/mfu_default.csv')['ratio_to_reference'].min():.2f}",
        lambda: f"{csv('gpu_check_h100/mfu_default.csv')['ratio_to_reference'].max():.2f}",
        source="gpu_check_h100/mfu_default.csv ratio_to_reference"),
    tie(R, "in the job times below, {} s, three GPU jobs at a time; it runs after every other part but ncu, so that "
        "it may take {} times that", stated("130"), stated("1.5"),
        source="bench/gpu_check_parts.py's estimate of the cut workflow part (an estimate, not a measurement)"),
    # section 5, 7: settings
    tie(R, "trunk: {}}}`: a trunk trained", config("bench/combine_trunk.yaml", "members.trunk", "g"),
        source="bench/combine_trunk.yaml members.trunk"),
    tie(R, "the trunk is counted once, so two members cost {}",
        lambda: format(1 + yaml.safe_load((REPO / "bench/combine_trunk.yaml").read_text())["members"]["trunk"], "g"),
        source="bench/combine_trunk.yaml members.trunk"),
    tie(R, "d1 = 64 and 128 train on {} tokens per parameter", stated("0.5"),
        source="bench/scaling.py --tokens-per-param's default"),
    # section 8: passes over level 1
    tie(R, "(level 1's training split holds 510k tokens) at M_0's budgets of 400k, 1.6M and 6.4M tokens ({}, {} and "
        "{} passes over level 1)",
        *(lambda b=b: f"{b / 510_000:.1f}" for b in (400_000, 1_600_000, 6_400_000)),
        source="the budgets over level 1's 510k tokens"),
    tie(R, "their maps train for {} of the refinement", stated("1/20"), source="growlm.recipes (ligo, mango)"),
    # section 14
    tie(R, "the peak held, the last {}% of the steps decaying", stated("20"),
        source="train.schedule: wsd's default decay (workflow/schemas/config.schema.yaml)"),
    tie(R, "then grown, under wsd, saves about {}% of the compute of the 60-layer", stated("80"),
        source="Bu 2025, arXiv 2511.04981 v1, abstract and Figure 1"),
    # the budgets section: citations
    tie(R, "arXiv 2001.08361, section {} and Table 1", stated("2.1"),
        source="Kaplan et al. 2020: where the non-embedding count is defined (a section number, not a measurement)"),
    # section 15: tied when its prose is rewritten from the new envelope table (tests: UNTIL)
]
