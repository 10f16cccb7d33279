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
CHECK = {"method": ["msg", "smooth_labels"], "n": 2, "d0": 16, "L0": 1, "d1": 32, "L1": 2, "head_dim": 8, "tied": True}


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


NEEDY = '''
from growlm.growth import register_operator
from growlm.refiners import Refiner


@register_operator("hold_inherited", axis="refine", needs=("inherited",))
class HoldInherited(Refiner):
    """Finds the inherited entries' masks the grow job wrote for it."""

    inputs = ("masks",)

    def __init__(self, *, masks=None):
        self.masks = masks

    @classmethod
    def settings(cls, options, *, growth, grown_dir, steps):
        return {**options, "masks": str(grown_dir / growth.provided["inherited"])}
'''


def test_a_refiner_says_what_it_needs_and_the_grow_job_provides_it(tmp_path):
    """A refiner's needs are part of its description (read from a plugin file without running it, and
    from its decorator): the chain check refuses them with a learned operator, and the grow job writes
    what each need asks for - without naming the refiner - and records it in growth.json."""
    import numpy as np

    from growlm.growth_record import Growth
    from growlm.jobs.grow import PROVIDERS, grow as grow_job
    from growlm.methods import GROW_NEEDS, OPERATORS, chain_needs
    from growlm.model import build_model, save_model
    from growlm.plugins import describe

    plugin = tmp_path / "needy.py"
    plugin.write_text(NEEDY)
    assert describe(plugin)[0].needs == ("inherited",)  # torch-free, as the Snakefile reads it
    check({"plugins": [str(plugin)], "checks": []})  # imports it: the decorator describes it again
    assert OPERATORS["hold_inherited"].needs == ("inherited",)
    assert set(PROVIDERS) == set(GROW_NEEDS)  # every need a refiner may declare has its provider
    assert chain_needs(["msg", "hold_inherited", "carry"]) == ["moments", "inherited"]
    assert chain_needs(["msg", "teach"]) == []
    with pytest.raises(GrowlmError, match="hold_inherited needs inherited from the grow job"):
        chain_names(["ligo", "hold_inherited"])

    np.save(tmp_path / "t.npy", np.arange(64, dtype=np.uint16) % 64)
    model = build_model(seed=1, n_embd=16, n_layer=1, vocab_size=64, n_positions=16, head_dim=8)
    save_model(model, tmp_path / "m1", extra={"train": {"flops": 1, "wall_s": 1.0}})
    grow_job(member_dirs=[tmp_path / "m1"], method="msg+hold_inherited", n_embd=32, n_layer=2, seed=0, options={},
             out_dir=tmp_path / "g", data_file=tmp_path / "t.npy", plugins=[str(plugin)])
    growth = Growth.read(tmp_path / "g")
    assert growth.provided == {"inherited": "inherited.safetensors"} and growth.plugins == [str(plugin)]
    settings = refiners.REFINERS["hold_inherited"].settings({}, growth=growth, grown_dir=tmp_path / "g", steps=10)
    assert (tmp_path / "g" / "inherited.safetensors").is_file() and settings["masks"].endswith("inherited.safetensors")
    assert refiners.REFINERS["hold_inherited"].identify(settings)  # the masks are part of the run's identity


def test_neither_the_grow_job_nor_the_chain_check_names_a_refiner():
    """The grow job provides needs and the chain check reads them: a refiner's name stands only in its
    description (methods.OPERATORS) and its implementation (growlm.refiners)."""
    import ast

    from growlm.methods import OPERATORS, REFINE

    names = {n for n, spec in OPERATORS.items() if spec.axis == REFINE}
    package = REPO / "workflow" / "scripts" / "growlm"
    for path in (package / "jobs" / "grow.py", *sorted((package / "methods").glob("*.py"))):
        tree = ast.parse(path.read_text())
        described = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call)
                     and getattr(call.func, "id", "") == "OperatorSpec" and call.args}
        named = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and node.value in names and id(node) not in described]
        assert not named, (path.name, named)
