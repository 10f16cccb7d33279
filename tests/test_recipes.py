"""Each method as its authors run it (growlm.recipes): the recipe defaults are applied where the config
sets nothing, expressed as shares of the run, and a user's settings override them. (The V-cycle's
recipe is tested in tests/test_vcycle.py.)"""

from __future__ import annotations

import copy
import math

import pytest
import yaml
from snakemake.utils import validate

from conftest import REPO
from growlm.errors import GrowlmError
from growlm.experiment import grow_settings, refine_settings, refine_steps, schedule_settings
from growlm.growth import options_of
from growlm.recipes import RECIPES, gstack_problem, gstack_tokens, learned_steps
from growlm.train import lr_at
from growlm.train_config import TrainConfig
from growlm.validate import timing_problems

BASE = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def config(**changes) -> dict:
    out = copy.deepcopy(BASE)
    for key, value in changes.items():
        out[key] = value
    out.setdefault("grow", {}).setdefault("options", {})
    validate(out, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))  # the schema's defaults, as the Snakefile
    return out


def test_the_learned_operators_train_a_share_of_the_refinement_unless_configured():
    c = config(budgets=[1_200_000, 4_800_000])
    steps = refine_steps(c, [1_200_000])  # the shortest refinement of the sweep
    assert learned_steps(steps) == max(10, steps // 20)
    for name in ("ligo", "mango"):
        assert grow_settings(c, name)["options"]["steps"] == learned_steps(steps)
    c["grow"]["options"] = {"ligo": {"steps": 7}}
    assert grow_settings(c, "ligo")["options"]["steps"] == 7  # the user's setting wins
    assert "steps" not in grow_settings(c, "msg")["options"]  # other operators: untouched
    assert learned_steps(40) == 10  # at least ten


def test_lemon_decays_faster_and_the_user_decides_otherwise():
    c = config()
    lemon = refine_settings(c, "lemon", seed=0, tokens=640_000, lr=2e-3)
    chain = refine_settings(c, "concat+lemon", seed=0, tokens=640_000, lr=2e-3)
    msg = refine_settings(c, "msg", seed=0, tokens=640_000, lr=2e-3)
    assert lemon["decay_share"] == chain["decay_share"] == pytest.approx(2 / 3) and msg["decay_share"] == 1.0
    assert {k: v for k, v in lemon.items() if k != "decay_share"} == {k: v for k, v in msg.items() if k != "decay_share"}
    c["train"]["refine"] = {**(c["train"].get("refine") or {}), "decay_share": 0.9}
    assert refine_settings(c, "lemon", seed=0, tokens=640_000, lr=2e-3)["decay_share"] == 0.9
    # the schedule: the same peak, the floor reached after 2/3 of the steps, then held
    cfg = TrainConfig(tokens=300 * 64, batch_size=1, context=64, lr=1e-3, warmup_steps=10, decay_share=2 / 3)
    full = TrainConfig(tokens=300 * 64, batch_size=1, context=64, lr=1e-3, warmup_steps=10)
    assert lr_at(9, cfg) == lr_at(9, full) == pytest.approx(1e-3)
    assert lr_at(200, cfg) == pytest.approx(1e-4) and lr_at(299, cfg) == pytest.approx(1e-4)
    assert lr_at(100, cfg) < lr_at(100, full)
    assert [lr_at(s, full) for s in range(300)] == [lr_at(s, TrainConfig(**{**full.to_dict(), "decay_share": 1.0}))
                                                   for s in range(300)]
    with pytest.raises(GrowlmError, match="decay_share"):
        TrainConfig(tokens=640, batch_size=1, context=64, lr=1e-3, warmup_steps=0, decay_share=0.0).validate()


def test_hypercloning_breaks_symmetry_with_the_papers_noise_by_default():
    assert options_of("hyperclone") == {"noise": pytest.approx(10 ** (-10 / 20), abs=1e-3)}


def test_apollo_runs_a_share_of_the_budget_at_the_large_rate_then_the_rest_without_rewarmup():
    c = config(budgets=[1_200_000, 2_400_000], lrs=[4e-3, 8e-3])
    s = schedule_settings(c, "apollo", n_embd=128, n_layer=4, seed=0)["apollo"]
    steps = 1_200_000 // (c["train"]["large"]["batch_size"] * c["model"]["context"])
    assert s == {"tokens": 300_000, "stages": "authors", "lr": 4e-3, "warmup_steps": round(0.025 * steps)}
    r = refine_settings(c, "apollo", seed=0, tokens=2_400_000, lr=8e-3)
    assert (r["tokens"], r["warmup_steps"], r["lr"]) == (1_800_000, 0, 8e-3)
    c["apollo"]["final_warmup"] = 0.1  # a tenth of the refinement warming up again (growlm's first variant did)
    r = refine_settings(c, "apollo", seed=0, tokens=2_400_000, lr=8e-3)
    assert r["warmup_steps"] == round(0.1 * (1_800_000 // (c["train"]["large"]["batch_size"] * c["model"]["context"])))
    c["apollo"] = {**c["apollo"], "tokens": 90_000, "lr": 1e-3, "warmup_steps": 5, "stages": "equal"}
    assert schedule_settings(c, "apollo", n_embd=128, n_layer=4, seed=0)["apollo"] == {
        "tokens": 90_000, "stages": "equal", "lr": 1e-3, "warmup_steps": 5}


def test_gstack_timing_reproduces_its_formula_and_refuses_targets_it_was_not_fitted_on():
    # log10 d = 0.88 log10 N + 163.27 / log10 C - 5.74 at the paper's 7B target and 300B tokens
    n, d = 7e9, 300e9
    assert math.log10(gstack_tokens(n, d)) == pytest.approx(0.88 * math.log10(n) + 163.27 / math.log10(6 * n * d)
                                                            - 5.74, abs=1e-9)
    assert gstack_problem(4.1e8, 20e9) is None
    c = config()  # the default experiment: a target of about a million parameters
    sweep = {"d1": list(c["d1"]), "L1": list(c["L1"]), "budgets": [c["train"]["large"]["tokens"]]}
    c["train"]["small"]["tokens"] = "gstack"
    (problem,) = timing_problems(c, sweep)
    assert problem.startswith("train.small.tokens = gstack: G_stack's growth-timing formula was fitted on targets")
    assert c["train"]["small"]["tokens"] == "gstack"  # left for the user to set
    big = config(d1=[1024], L1=[24])
    big["tokenizer"]["vocab_size"] = 32000
    big["train"]["small"]["tokens"] = "gstack"
    assert timing_problems(big, {"d1": [1024], "L1": [24], "budgets": [20_000_000_000]}) == []
    assert isinstance(big["train"]["small"]["tokens"], int) and 0 < big["train"]["small"]["tokens"] < 20_000_000_000
    two = timing_problems(copy.deepcopy(c), {"d1": [128], "L1": [4], "budgets": [1, 2]})
    assert "one target and budget" in two[0]


def test_every_recipe_names_a_method_growlm_runs():
    from growlm.methods import OPERATORS

    assert set(RECIPES) <= set(OPERATORS)  # the schedules are described there too
