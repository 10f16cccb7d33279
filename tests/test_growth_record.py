"""growth.json is one typed record (growlm.growth_record.Growth), written in one place and read through it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from growlm.errors import GrowlmError
from growlm.growth_record import GROWTH_FILE, Growth

PACKAGE = Path(__file__).resolve().parents[1] / "workflow" / "scripts" / "growlm"
SCRIPTS = PACKAGE.parent


def _sources():
    return sorted([*PACKAGE.rglob("*.py"), *SCRIPTS.glob("*.py")])


def test_a_record_reads_back_as_written(tmp_path):
    members = [{"dir": "m1", "flops": 10, "wall_s": 1.5}, {"dir": "t", "flops": 3, "wall_s": 0.5, "role": "trunk"}]
    g = Growth(method="msg+carry", chain=["msg", "carry"], options={"ramp_steps": 4}, growth_flops=123,
               growth_wall_s=0.25, members=members, provided={"moments": "moments.safetensors", "moments_step": 7},
               plugins=["p.py"])
    path = g.write(tmp_path)
    assert path == tmp_path / GROWTH_FILE
    assert Growth.read(tmp_path) == g == Growth.read(path)
    data = json.loads(path.read_text())
    # the keys growth.json always had: the provided entries at the top level, no stages for an operator
    assert list(data) == ["method", "chain", "options", "growth_flops", "growth_wall_s", "members", "moments",
                          "moments_step", "plugins"]
    schedule = Growth(method="s", chain=["s"], options={"a": 1}, growth_flops=5, growth_wall_s=1.0, stages=[{"x": 1}])
    data = json.loads(schedule.to_json())
    assert data["stages"] == [{"x": 1}] and data["members"] == [] and "plugins" not in data
    assert Growth.from_dict(data) == schedule


def test_a_record_of_an_older_growlm_reads_with_defaults(tmp_path):
    (tmp_path / GROWTH_FILE).write_text(json.dumps({"members": [{"dir": "m", "flops": 1}], "growth_flops": 0,
                                                    "inherited": "inherited.safetensors"}))
    g = Growth.read(tmp_path)
    assert (g.chain, g.options, g.growth_wall_s, g.plugins, g.stages) == ([], {}, 0.0, [], None)
    assert g.provided == {"inherited": "inherited.safetensors"}


def test_a_provided_entry_may_not_shadow_a_field():
    with pytest.raises(GrowlmError, match="names of its own fields"):
        Growth(provided={"members": "x"}).to_dict()


def test_growth_json_is_named_and_written_in_one_place():
    """Only growth_record spells the file's name (hints, below it in the layers, maps a file inside a grown
    folder to that folder's declared growth.json), and the library writes a record in one call: the grow
    job's `finish`, which every grow job (operator, chain or schedule) ends with."""
    named, writes = [], []
    for path in _sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == GROWTH_FILE:
                named.append(path.name)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("write", "to_json", "to_dict") and path.name != "growth_record.py":
                    receiver = ast.unparse(node.func.value)
                    if receiver == "growth" or receiver.startswith("Growth("):
                        writes.append((path.relative_to(SCRIPTS).as_posix(), node.func.attr))
                if node.func.attr in ("write_text", "open") and GROWTH_FILE in ast.unparse(node):
                    writes.append((path.relative_to(SCRIPTS).as_posix(), node.func.attr))
    assert sorted(set(named)) == ["growth_record.py", "hints.py"], named
    # the refine job's growlm.json carries the record too (to_dict), but only finish writes growth.json
    assert [w for w in writes if w[1] != "to_dict"] == [("growlm/jobs/grow.py", "write")], writes
