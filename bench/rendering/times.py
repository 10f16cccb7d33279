"""The times the pages print (the default run's, the suite's), from bench/results/times.csv.

Every row there was written by the command that measured it (`bench/times.py`) or copied from the commit that
first stated it, with that commit: a time is a measurement of one version of the code on one machine, so a page
prints it with its commit, cores and date, and a time with no row is not printed.
"""

from __future__ import annotations

import pandas as pd

from rendering.core import README_PAGE, RESULTS_PAGE, block, sentence

TIMES = "times.csv"


def rows(df: pd.DataFrame) -> dict[str, dict]:
    """times.csv by `what`; seconds as int, and the date's month for prose."""
    out = {}
    for _, r in df.iterrows():
        d = r.to_dict()
        d["seconds"] = int(d["seconds"])
        d["minutes"] = f"{d['seconds'] / 60:.1f}"
        d["month"] = pd.Timestamp(d["date"]).strftime("%B %Y")
        d["tests"] = None if pd.isna(d["tests"]) else f"{int(d['tests']):,}"
        out[r["what"]] = d
        if r["what"] in ("suite", "suite_cache_filled"):  # the suite's latest measurement, either kind
            out["suite_latest"] = d
    return out


@block("readme-run-time", README_PAGE, TIMES)
def readme_run_time(df) -> str:
    return sentence("readme_run_time", t=rows(df))


@block("readme-suite-time", README_PAGE, TIMES)
def readme_suite_time(df) -> str:
    return sentence("readme_suite_time", t=rows(df))


@block("results-run-time", RESULTS_PAGE, TIMES)
def results_run_time(df) -> str:
    return sentence("results_run_time", t=rows(df))


@block("contributing-times", "CONTRIBUTING.md", TIMES)
def contributing_times(df) -> str:
    return sentence("contributing_times", t=rows(df))


@block("config-run-time", "config/config.yaml", TIMES)
def config_run_time(df) -> str:
    return sentence("config_run_time", t=rows(df))


@block("tests-suite-time", "tests/README.md", TIMES)
def tests_suite_time(df) -> str:
    return sentence("tests_suite_time", t=rows(df))
