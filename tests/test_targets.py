"""One stage at a time: the stages' named targets (members, grown, baseline, refined, and rule compare) plan
exactly their stage's jobs, and `--until RULE` plans every training rule's jobs and those before them, in a
folder whose token files exist (workflow/rules/targets.smk). There Snakemake 9.27.1 alone planned nothing for
`--until train_small` ("Nothing to be done", no member trained): the token files are a checkpoint's outputs.
Every plan here is conftest's `plan`, in this process, in a copy of the finished tiny run less its models."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from conftest import REPO, TINY, copy_run, planned_counts
from test_envelope_workflow import WSD, wsd_run  # noqa: F401 (wsd_run: its finished run, shared)

# the tiny experiment (tests/config/tiny.yaml): n = 2 members; 3 grown models, each refined (hyperclone+zero_block,
# concat+zero_block, and concat's m_1-only control); one M_0
MEMBERS = {"train_small": 2}
GROWN = {**MEMBERS, "grow": 3}
REFINED = {**GROWN, "refine": 3}
BASELINE = {"train_baseline": 1}

# The members branch from one shared trunk (members.trunk): a trunk job before them.
TRUNK = "members: {trunk: 0.5}\n"
# WSD (tests/test_envelope_workflow.py's): the large jobs under wsd with two cooldown branches each, one method
WSD_REFINED = {"train_small": 1, "grow": 1, "refine": 1}  # msg reads member 1 alone

# `--until RULE` for every rule that trains: (overlay, what it plans)
UNTIL = {
    "train_small": (None, MEMBERS),
    "train_trunk": ("trunk.yaml", {"train_trunk": 1}),
    "grow": (None, GROWN),
    "train_baseline": (None, BASELINE),
    "refine": (None, REFINED),
    "cooldown_baseline": ("wsd.yaml", {**BASELINE, "cooldown_baseline": 2}),
    "cooldown_refine": ("wsd.yaml", {**WSD_REFINED, "cooldown_refine": 2}),
}
# rules of rules/train.smk that train nothing: a member imported, what M_0 and the tokenizer take from it
NOT_TRAINING = {"import_member", "member_part"}

# every named target: (overlay, what it plans besides itself)
EVALUATED = {"evaluate_model": 6, "evaluate_ensemble": 1}  # 2 members, 3 refined models, M_0; the ensemble
STAGES = {
    "members": (None, MEMBERS),
    "grown": (None, GROWN),
    "baseline": (None, BASELINE),
    "refined": (None, REFINED),
    "compare": (None, {**REFINED, **BASELINE, **EVALUATED}),
    "baseline wsd": ("wsd.yaml", {**BASELINE, "cooldown_baseline": 2}),
    "refined wsd": ("wsd.yaml", {**WSD_REFINED, "cooldown_refine": 2}),
}


@pytest.fixture(scope="module")
def tokens_made(tiny_run, tmp_path_factory):
    """The finished tiny run less its models and evaluations: corpus, tokenizer and token files made (the
    checkpoint encode_split's outputs present), every model to train and evaluate. (A comparison left in place
    would be done: Snakemake reruns no job for an input that is missing when its outputs are there.)"""
    wd = copy_run(tiny_run, tmp_path_factory.mktemp("targets") / "wf", tiny=("models", "checkpoints", "eval"))
    (wd / "trunk.yaml").write_text(TRUNK)
    (wd / "wsd.yaml").write_text(WSD)
    return wd


def configfiles(overlay):
    return (TINY, *([overlay] if overlay else []))


def test_every_training_rule_is_tried_with_until():
    """A rule that trains, added to rules/train.smk, is added to UNTIL."""
    rules = set(re.findall(r"^rule (\w+):", (REPO / "workflow" / "rules" / "train.smk").read_text(), flags=re.M))
    assert (rules - NOT_TRAINING) | {"grow"} == set(UNTIL), rules  # grow trains under a schedule


@pytest.mark.parametrize("rule", UNTIL)
def test_until_a_training_rule_plans_its_jobs_and_those_before_them_once_the_tokens_exist(tokens_made, rule):
    """`--until RULE` in a folder whose token files exist: the rule's jobs and the training jobs they need,
    nothing after them (train_small planned nothing here before rules/targets.smk)."""
    overlay, expected = UNTIL[rule]
    assert planned_counts(tokens_made, configfiles=configfiles(overlay), until=(rule,)) == Counter(expected)


def test_until_plans_nothing_in_a_finished_run(tiny_run):
    """The until jobs' own outputs are asked for, and a finished run has them all: nothing to do."""
    for rule in ("train_small", "grow", "train_baseline", "refine"):
        assert planned_counts(tiny_run, configfiles=(TINY,), until=(rule,)) == Counter(), rule


def test_until_plans_nothing_in_a_finished_run_whose_branch_states_are_gone(wsd_run):  # noqa: F811 (the fixture)
    """A large job's states for its cooldown branches are temporary outputs, deleted once read: `--until` does
    not ask for them, so a finished M_0 or M_1 is not trained again for them."""
    wd, _ = wsd_run
    for rule in ("train_baseline", "refine", "cooldown_baseline", "cooldown_refine"):
        assert planned_counts(wd, configfiles=(TINY, "wsd.yaml"), until=(rule,)) == Counter(), rule


@pytest.mark.parametrize("stage", STAGES)
def test_a_named_target_plans_exactly_its_stage(tokens_made, stage):
    """`snakemake members` (baseline, ...): the stage's jobs and those it needs, in a folder whose tokens exist."""
    target, _, _ = stage.partition(" ")
    overlay, expected = STAGES[stage]
    counts = planned_counts(tokens_made, configfiles=configfiles(overlay), targets=(target,))
    counts.pop(target, None)  # the named target itself (rule compare is a job; the others only ask for files)
    assert counts == Counter(expected)


def test_a_named_target_plans_nothing_in_a_finished_run(tiny_run):
    for target in ("members", "grown", "baseline", "refined", "compare"):
        assert planned_counts(tiny_run, configfiles=(TINY,), targets=(target,)) == Counter(), target
