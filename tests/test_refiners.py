"""Refinement operators compose by a rule, and a plugin's is exercised before the first job.

A step minimises one loss: a chain may hold at most one refiner that replaces the loss (teach, or a
plugin that overrides `loss`). `[msg, teach, smooth_labels]` was accepted, ran smooth_labels alone (the
refiners ran in name order and the first loss won) and still counted teach's teacher passes in the
ledger. Now such a chain stops before any job naming both; built by hand it stops when the run is set
up. A plugin refinement operator is refined for a few steps of the real loop before the first job, so
that an error in its code is named then, not after the grow job ran.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO, TINY, run_snakemake
from growlm import refiners
from growlm.errors import GrowlmError
from growlm.jobs.plugins import check
from growlm.methods import chain_names

EXAMPLE = str(REPO / "examples" / "smooth_labels.py")


@pytest.fixture(autouse=True)
def operators_as_they_were():
    """Plugins a test registers are forgotten after it (other tests of this process declare the same
    names from their own copies of the files)."""
    from growlm.growth.registry import IMPLEMENTATIONS
    from growlm.methods import OPERATORS

    saved = dict(OPERATORS), dict(IMPLEMENTATIONS), dict(refiners.REFINERS)
    yield
    for table, before in zip((OPERATORS, IMPLEMENTATIONS, refiners.REFINERS), saved):
        table.clear()
        table.update(before)
CHECK = {"method": ["msg", "smooth_labels"], "n": 2, "d0": 16, "L0": 1, "d1": 32, "L1": 2, "head_dim": 8}


def test_two_loss_owners_stop_the_dry_run_naming_both(workflow_dir):
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(TINY), "--config",
                         "methods=[[msg, teach, smooth_labels], [msg, smooth_labels, carry]]",
                         "grow={plugins: [examples/smooth_labels.py]}", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Building DAG" not in out
    assert "growth chain ['msg', 'teach', 'smooth_labels']: teach and smooth_labels each replace the training loss" in out
    assert "['msg', 'smooth_labels', 'carry']" not in out  # one loss owner with carry: allowed


def test_a_run_given_two_loss_owners_stops_before_training(tmp_path):
    check({"plugins": [EXAMPLE], "checks": []})  # registers smooth_labels
    with pytest.raises(GrowlmError, match="smooth_labels and teach each replace the training loss"):
        refiners.build({"teach": {"teachers": [str(tmp_path)]}, "smooth_labels": {"smooth_steps": 2}})
    assert chain_names(["msg", "smooth_labels", "carry"])


def test_a_plugin_refiner_runs_a_few_steps_before_the_first_job(tmp_path):
    assert check({"plugins": [EXAMPLE], "checks": [CHECK]}) == ["msg+smooth_labels (2 x 16x1 -> 32x2)"]
    broken = tmp_path / "typo.py"
    broken.write_text(open(EXAMPLE).read().replace("label_smoothing=self.smoothing", "label_smoothing=self.smothing")
                      .replace('"smooth_labels"', '"typo_labels"'))
    with pytest.raises(GrowlmError) as err:
        check({"plugins": [str(broken)], "checks": [{**CHECK, "method": ["msg", "typo_labels"]}]})
    text = str(err.value)
    assert f"grow.plugins: {broken}: refinement operator 'typo_labels' (in msg+typo_labels) raised AttributeError" \
           in text and "smothing" in text
    json.dumps(text)  # one line, printable as the check's message
    assert "\n" not in text
