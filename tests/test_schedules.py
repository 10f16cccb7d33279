"""Schedules are described like operators: one description each in growlm.methods.OPERATORS (axis
"schedule": options, defaults, settings, check), one implementation registered in growlm.schedules, and
everything else - the rules, the grow entry script, the checks, the refinement's recipe - reads them."""

from __future__ import annotations

import json
import runpy
from types import SimpleNamespace

import pytest
import yaml
from snakemake.utils import validate

from conftest import REPO
from growlm.errors import GrowlmError
from growlm.growth_record import Growth
from growlm.methods import OPERATORS, SCHEDULE, OperatorSpec, chain_names, is_schedule, methods, schedules

SCRIPTS = REPO / "workflow" / "scripts"


def test_each_schedule_is_described_with_its_config_sections_defaults():
    """A schedule's options are its config section: the same keys and defaults as the schema's."""
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert schedules() == ["vcycle", "apollo"] and not set(schedules()) & set(methods())
    for name in schedules():
        section = schema["properties"][name]["properties"]
        assert OPERATORS[name].options == {k: v.get("default") for k, v in section.items()}, name
        assert OPERATORS[name].settings is not None and OPERATORS[name].summary
    with pytest.raises(GrowlmError, match="vcycle is a training schedule and cannot be chained"):
        chain_names(["msg", "vcycle"])


def test_the_code_names_a_schedule_only_where_it_is_described_or_implemented():
    """Outside growlm.schedules, `vcycle` and `apollo` stand only in their descriptions (methods/), their
    authors' recipes' text (recipes.py) and the docstrings: no code dispatches on their names."""
    import ast

    files = [*(SCRIPTS / "growlm").rglob("*.py"), *SCRIPTS.glob("*.py")]
    for path in files:
        if "schedules" in path.parts or "methods" in path.parts or path.name == "recipes.py":
            continue
        tree = ast.parse(path.read_text())
        docs = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                assert not {"vcycle", "apollo"} & set(node.value.replace(".", " ").split()), (path.name, node.value)
    for rule in (REPO / "workflow" / "rules").glob("*.smk"):
        code = "\n".join(line.split("#")[0] for line in rule.read_text().splitlines())
        assert "vcycle" not in code and "apollo" not in code, rule.name


@pytest.fixture
def toy_schedule(monkeypatch):
    """A new schedule, registered the way a built-in one is: its description in OPERATORS, its runner
    with `growlm.schedules.registry.runs`."""
    from growlm.schedules.registry import RUNNERS, runs

    def settings(config, *, model, seed, reference, lr, train):
        return {"toy": {"scale": config["toy"]["scale"]}, "model": model}

    monkeypatch.setitem(OPERATORS, "toy", OperatorSpec("toy", SCHEDULE, exact=False, options={"scale": 1.0},
                                                       settings=settings, summary="a toy schedule"))
    monkeypatch.setitem(RUNNERS, "toy", None)

    @runs("toy")
    def run(*, toy, model, seed, train_file, val_file, tokenizer_dir, out_dir):
        from growlm.model import build_model

        grown = build_model(seed=seed, vocab_size=64, **model)
        return grown, {"flops": 7 * int(toy["scale"]), "wall_s": 0.5, "stages": [{"stage": 1}]}

    return settings


def test_a_new_schedule_is_dispatched_without_touching_the_grow_script(toy_schedule, tmp_path):
    """The grow rule's entry script runs a schedule it has never heard of: it asks the registry."""
    from growlm.experiment import schedule_settings  # noqa: F401 (what grow_params calls: the description's)

    from growlm.tokenizer import fit_tokenizer

    assert is_schedule("toy") and "toy" in schedules()
    (tmp_path / "t.txt").write_text("the cat sat on the mat\n" * 50)
    fit_tokenizer([tmp_path / "t.txt"], tmp_path / "tok", vocab_size=270)
    params = toy_schedule({"toy": {"scale": 3}}, model={"n_embd": 16, "n_layer": 1, "n_positions": 16,
                                                        "head_dim": 8}, seed=0, reference=0, lr=0.0, train=None)
    out = tmp_path / "grown"
    sm = SimpleNamespace(
        log=[str(tmp_path / "grow.log")], rule="grow", threads=1, params=SimpleNamespace(grow=params),
        resources=SimpleNamespace(gpu=0),
        wildcards=SimpleNamespace(method="toy", seed="2", d1="16", L1="1"), output=[str(out / "growth.json")],
        input=SimpleNamespace(tokenizer=str(tmp_path / "tok" / "tokenizer.json"), data=str(tmp_path / "t.npy"),
                              val=str(tmp_path / "v.npy")))
    runpy.run_path(str(SCRIPTS / "grow.py"), init_globals={"snakemake": sm})
    growth = Growth.read(out)
    assert (growth.method, growth.chain, growth.options, growth.growth_flops, growth.members) == (
        "toy", ["toy"], {"scale": 3}, 21, [])
    assert growth.stages == [{"stage": 1}] and json.loads((out / "config.json").read_text())["n_embd"] == 16
    assert (out / "tokenizer.json").is_file()  # the grown folder is a transformers folder, as for every grow job


def test_a_schedules_grow_params_and_refinement_come_from_its_description(toy_schedule):
    """grow_params (rules/params.smk) asks `schedule_settings`, which asks the description; the refinement
    after a schedule is its `final_share` of the budget when its options have one (recipes)."""
    import copy

    from growlm.experiment import refine_settings, schedule_settings

    config = copy.deepcopy(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    validate(config, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))  # its defaults, as the Snakefile
    config["toy"] = {"scale": 2}
    assert schedule_settings(config, "toy", n_embd=32, n_layer=2, seed=0) == {
        "model": {**schedule_settings(config, "apollo", n_embd=32, n_layer=2, seed=0)["model"]},
        "toy": {"scale": 2}}
    tokens = int(config["train"]["large"]["tokens"])
    assert refine_settings(config, "toy", seed=0, tokens=tokens, lr=1e-3)["tokens"] == tokens  # no final_share
    OPERATORS["toy"] = OperatorSpec("toy", SCHEDULE, exact=False, options={"scale": 1.0, "final_share": 0.5},
                                    settings=toy_schedule)
    assert refine_settings(config, "toy", seed=0, tokens=tokens, lr=1e-3)["tokens"] == round(tokens / 2)


def test_a_schedule_checks_the_sweep_only_when_it_stands_in_it():
    import copy

    from growlm.experiment import normalise_sweep
    from growlm.validate import _schedule_problems

    config = copy.deepcopy(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    validate(config, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))  # its defaults, as the Snakefile
    config["vcycle"]["levels"] = 5  # 16 times narrower: not whole heads at the default widths
    config["methods"] = ["msg", ["msg", "vcycle"]]  # a chained schedule is refused elsewhere, not checked here
    assert _schedule_problems(config, normalise_sweep(config)) == []
    config["methods"] = ["vcycle"]
    problems = _schedule_problems(config, normalise_sweep(config))
    assert problems and all(p.startswith("vcycle: 5 levels by factor 2 need d1 = ") for p in problems)
