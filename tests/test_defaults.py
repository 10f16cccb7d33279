"""Defaults live in one place, and a new setting touches the places CONTRIBUTING.md names.

A config value has one default: config/config.yaml's, which the schema repeats
(tests/test_identity.py: the two agree). Library code reads the validated config and never restates a
default with `.get(key, default)`: such a second default silently wins whenever the key is missing
(`experiment.train_config` once warmed up for 0 steps where config.yaml says 30). A run built in code
takes the same defaults: TrainConfig reads them from the schema.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import validated_config

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "workflow" / "scripts" / "growlm"
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"

# Calls `x.get(<a schema key>, <default>)` that are not reads of the config, each with why.
NOT_CONFIG = {
    ("jobs/grow.py", "steps"): "an operator's options (ligo, mango), whose defaults are the OperatorSpec's",
    ("growth/masked.py", "family"): "a saved masked model's own metadata",
    ("live.py", "experiment"): "a live curve's run summary, not the config",
    ("recipes.py", "final_warmup"): "a schedule's options over its description's; one without the option does not warm up again",
    ("pretrained.py", "model"): "a member's tokenizer.json",
    ("compare.py", "baseline"): "the cooldown branches' points by kind (the compare rule's params), not the config",
    ("runs.py", "baseline"): "the cooldown branches' points by kind (the compare rule's params), not the config",
    ("runs.py", "refine"): "the cooldown branches' points by kind (the compare rule's params), not the config",
    ("compare.py", "refine"): "the cooldown branches' points by kind (the compare rule's params), not the config",
}


def _schema_keys_with_defaults() -> set[str]:
    keys = set()

    def walk(node):
        if isinstance(node, dict):
            for key, sub in (node.get("properties") or {}).items():
                if isinstance(sub, dict) and sub.get("default") is not None:
                    keys.add(key)
            for sub in node.values():
                walk(sub)
        elif isinstance(node, list):
            for sub in node:
                walk(sub)

    walk(yaml.safe_load(SCHEMA.read_text()))
    return keys


def test_no_config_default_is_restated_in_the_library():
    """`.get("<key>", <value>)` on a key the schema gives a default is a second default for it."""
    keys, found = _schema_keys_with_defaults(), []
    for path in sorted(LIBRARY.rglob("*.py")):
        where = path.relative_to(LIBRARY).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)):
                continue
            key, default = node.args[0].value, node.args[1]
            if key not in keys or (isinstance(default, ast.Constant) and default.value is None):
                continue
            if (where, key) not in NOT_CONFIG:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "read the validated config instead: " + "; ".join(found)


def test_a_run_built_in_code_takes_the_schema_s_defaults():
    """TrainConfig states no default of its own for what the config describes: every field named by a
    `train` key or model.context takes the schema's default (read from the schema, not written
    again as a literal), and a field the schema requires of every stage has none."""
    from dataclasses import MISSING, fields

    from growlm.train_config import TrainConfig

    schema = yaml.safe_load(SCHEMA.read_text())
    train = schema["properties"]["train"]["properties"]
    stage = schema["$defs"]["train_stage"]
    described = {**{k: v for k, v in train.items() if isinstance(v, dict)},
                 "context": schema["properties"]["model"]["properties"]["context"]}
    by_name = {f.name: f for f in fields(TrainConfig)}
    for key in stage["required"]:
        assert by_name[key].default is MISSING, f"TrainConfig.{key} has a default; the schema requires it of every stage"
    compared = [key for key in described if key in by_name and key not in stage["properties"]]
    assert {"context", "eval_tokens", "dense_log_steps", "compile", "sync_every"} <= set(compared), compared
    for key in compared:
        assert by_name[key].default == described[key]["default"], key
    # written once: the class body reads SCHEMA_DEFAULTS for each of them, never a literal
    source = (LIBRARY / "train_config.py").read_text()
    cls = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "TrainConfig")
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and node.target.id in compared:
            assert ast.unparse(node.value) == f"SCHEMA_DEFAULTS['{node.target.id}']", ast.unparse(node)
    with pytest.raises(TypeError, match="batch_size"):
        TrainConfig(tokens=1000, lr=1e-3, warmup_steps=0)


def test_the_exceptions_still_exist():
    """Each entry of NOT_CONFIG names a call that is there (a stale entry would hide a new one)."""
    for (where, key), why in NOT_CONFIG.items():
        source = (LIBRARY / where).read_text()
        assert f'.get("{key}",' in source, f"{where} no longer reads {key!r} ({why}): drop it from NOT_CONFIG"


def test_a_new_training_setting_is_a_field_and_a_schema_key(monkeypatch):
    """A `train` key that names a TrainConfig field reaches the run's settings with nothing else
    changed: growlm.experiment maps keys to fields by name (CONTRIBUTING.md, "Adding a config key")."""
    from growlm import experiment
    from growlm.train_config import TrainConfig

    @dataclass
    class WithSmoothing(TrainConfig):
        label_smoothing: float = 0.0

    monkeypatch.setattr(experiment, "TrainConfig", WithSmoothing)
    config = validated_config()
    config["train"]["large"]["label_smoothing"] = 1  # as a user writes it: cast to the field's type
    config["train"]["small"]["label_smoothing"] = 0.2
    large = experiment.train_settings(config, "large", seed=0)
    refine = experiment.train_settings(config, "refine", seed=0)
    small = experiment.train_settings(config, "small", seed=0)
    assert large["label_smoothing"] == 1.0 and isinstance(large["label_smoothing"], float)
    assert refine["label_smoothing"] == 1.0  # the refinement takes the large arms' settings
    assert small["label_smoothing"] == 0.2
    # how the steps run is the machine's: never taken from the config into a rule's params
    config["train"]["compile"] = True
    assert experiment.train_config(config, "large", seed=0).compile is False


@pytest.mark.parametrize("stage", ["small", "large", "refine"])
def test_every_setting_of_a_run_comes_from_the_config(stage):
    """Changing any training value of the config changes the run's settings: none is a default the
    library keeps for itself."""
    from growlm.experiment import train_settings

    base = train_settings(validated_config(), stage, seed=0)
    shared = ("min_lr_ratio", "weight_decay", "grad_clip", "eval_interval", "eval_tokens", "checkpoint_every")
    own = ("tokens", "lr", "batch_size", "warmup_steps")
    section = "large" if stage == "refine" else stage
    for key in shared + own:
        config = validated_config()
        where = config["train"] if key in shared else config["train"][section]
        if stage == "refine" and key in ("batch_size", "warmup_steps"):
            where = config["train"].setdefault("refine", {})
        where[key] = where.get(key, base[key]) * 2 if key != "min_lr_ratio" else 0.5
        assert train_settings(config, stage, seed=0)[key] != base[key], key


def test_a_stage_without_a_setting_is_named_not_defaulted(tmp_path):
    """A config of one's own (a deployed workflow's config/config.yaml) that leaves out a stage's batch size
    stops at the schema with one line naming it; no library default stands in for it."""
    from growlm.config_values import schema_problems

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    del config["train"]["small"]["batch_size"]
    problems = schema_problems(config, yaml.safe_load(SCHEMA.read_text()))
    assert any("train.small" in p and "batch_size" in p for p in problems), problems
