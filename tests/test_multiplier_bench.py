"""bench/multiplier.py (RESULTS 15), without training: every folder's config validates at both budgets, the M_0
branch points it reads are the ones the workflow plans for its extension, the rendered section names the arms it
defines, and an unknown arm is refused in one line before anything runs."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import validated_config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import multiplier  # noqa: E402
from rendering import multiplier as rendered  # noqa: E402

sys.path.remove(str(REPO / "bench"))


@pytest.mark.parametrize("key", sorted(multiplier.BUDGETS))
@pytest.mark.parametrize("name", multiplier.ARMS)
def test_every_folder_config_validates_and_m0_branches_are_the_workflows(key, name):
    from growlm.experiment import branch_points

    arm = multiplier.all_arms(key)[name]
    bench = yaml.safe_load(multiplier.OUT.parent.joinpath("envelope.yaml").read_text())
    config = validated_config(bench, {"budgets": [multiplier.BUDGETS[key]]},
                              multiplier._merge(arm["overlay"]))
    assert config["baseline"]["extend"] == multiplier.EXTEND
    planned = branch_points(config, "large")
    assert sorted(planned) == sorted(multiplier.point_ids(multiplier.M0_POINTS))
    assert max(planned.values()) < multiplier.EXTEND  # every branch ends before M_0's extended run does
    assert sorted(branch_points(config, "refine").values()) == list(multiplier.REFINE_POINTS)


def test_the_rendered_section_knows_the_arms_the_bench_defines():
    assert rendered.ARMS == multiplier.ARMS
    assert set(rendered.BUDGET_KEYS) == set(multiplier.BUDGETS.values())


def test_an_unknown_arm_is_refused_before_anything_runs(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "multiplier.py"), "--root", str(tmp_path),
                           "--arms", "msg; members 5%"], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO / "workflow" / "scripts"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "unknown arms ['members 5%']" in proc.stderr
    assert list(tmp_path.iterdir()) == []
