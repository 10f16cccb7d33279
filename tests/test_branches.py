"""A cooldown branch is the run planned for its own budget (growlm.branches), for every refiner: on the tiny
experiment under wsd, a branch of a `teach` arm (teach_steps a share) and of one whose refiner and mask ramp are
step counts train to the weights of the refinement a config of the branch's budget runs; M_0 trained past its
budget (`baseline.extend`) has a branch that is its run of exactly the budget, and `baseline_ends` lists its
finished runs. The jobs' own functions run in this process on the tiny experiment's settings, with members and a
grown model made here (seconds, no workflow run)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import REPO, TINY, copy_workflow, learnable_tokens, plan, validated_config

METHOD = "msg+teach"
BUDGET = 12000  # tiny.yaml's train.large.tokens halved: 46 refinement steps, decaying from step 37


def tiny(*overlays) -> dict:
    """config/config.yaml under tests/config/tiny.yaml and `overlays` (YAML), validated as the Snakefile does."""
    base = "{train: {schedule: wsd, large: {tokens: %d}, refine: {branches: [0.35]}}, methods: [[msg, teach]]}" % BUDGET
    return validated_config(*(yaml.safe_load(o) for o in (TINY.read_text(), base, *overlays)))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The tiny experiment's pieces, made here: a tokenizer, token files, two members of its member shape and
    their [msg, teach] growth (msg's default options: growth does not depend on the refinement's settings)."""
    from growlm.experiment import grow_settings, model_settings
    from growlm.jobs.grow import grow
    from growlm.model import build_model, save_model
    from growlm.tokenizer import fit_tokenizer, vocab_size

    root = tmp_path_factory.mktemp("branches")
    fit_tokenizer([REPO / "workflow/resources/corpus/pg18735_little_red_hen.txt"], root / "tok", vocab_size=300)
    vocab = vocab_size(root / "tok")
    np.save(root / "train.npy", learnable_tokens(vocab, 60000))
    np.save(root / "val.npy", learnable_tokens(vocab, 6000, seed=1))
    config = tiny()
    for i in (1, 2):
        member = build_model(seed=i, vocab_size=vocab, **model_settings(config, n_embd=16, n_layer=1))
        save_model(member, root / f"m{i}", tokenizer_dir=root / "tok", extra={"train": {"flops": 1, "wall_s": 1.0}})
    grow(member_dirs=[root / "m1", root / "m2"], method=METHOD, n_embd=32, n_layer=2, seed=0,
         options=grow_settings(config, METHOD)["options"], out_dir=root / "grown", data_file=root / "train.npy")
    return {"root": root, "files": dict(train_file=root / "train.npy", val_file=root / "val.npy",
                                        tokenizer_dir=root / "tok")}


def refinement(config, tokens, budgets):
    """The refine job's arguments for `METHOD` at `tokens` in a sweep of `budgets`, as the workflow resolves them."""
    from growlm.experiment import refine_operators, refine_ramps, refine_settings

    return dict(train=refine_settings(config, METHOD, seed=0, tokens=tokens, lr=0.003),
                ramps=refine_ramps(config, METHOD, budgets=budgets, budget=tokens),
                refine_with=refine_operators(config, METHOD, budgets=budgets, budget=tokens))


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def branch_and_planned_run(made, tmp_path, *overlays):
    """The refinement at BUDGET with its branch at 0.35 (kept state, cooldown job, model kept), and the
    refinement a config whose budget is the branch's runs: (branch record, branch folder, planned run folder)."""
    from growlm.branches import kept_steps, refine_branch
    from growlm.jobs.train import cooldown, refine

    torch.set_num_threads(1)
    config = tiny(*overlays)
    plan_ = refine_branch(config, METHOD, seed=0, budget=BUDGET, lr="0.003", fraction=0.35, budgets=[BUDGET])
    start = dict(grown_dir=made["root"] / "grown", **refinement(config, BUDGET, [BUDGET]), **made["files"])
    full = tmp_path / "full"
    state = full / "branches" / "b35" / "state"
    if not plan_["from_start"]:  # the state it continues, kept by the refinement as the workflow's job keeps it
        refine(out_dir=full, branches=kept_steps(config, "refine", seed=0, budget=BUDGET, lr="0.003", method=METHOD),
               **start)
        assert state.is_dir()
    record = cooldown(kind="refine", branch=plan_, state_dir=state, out_dir=tmp_path / "b35", keep_model=True,
                      **start)
    short = tiny(*overlays, f"{{train: {{large: {{tokens: {plan_['tokens']}}}}}}}")  # the config of that budget
    refine(out_dir=tmp_path / "planned", grown_dir=made["root"] / "grown",
           **refinement(short, plan_["tokens"], [plan_["tokens"]]), **made["files"])
    return plan_, record, tmp_path / "b35", tmp_path / "planned"


def test_a_teach_arms_branch_is_the_run_planned_for_its_budget(made, tmp_path):
    """teach_steps: 0.1 teaches a tenth of the branch's own steps (1 of 16, not 4 of 46) and msg's default ramp
    is a fifth of the branch (3 steps, not 9): the branch's first steps are not the full run's, so it runs from
    M'_1 at step 0, all of its cost the measurement's, and it is the refinement of its budget to float tolerance."""
    plan_, record, branch, planned = branch_and_planned_run(made, tmp_path, "{grow: {options: {teach: {teach_steps: 0.1}}}}")
    assert plan_["from_start"] and plan_["refine_with"]["teach"]["teach_steps"] == 1 and plan_["ramps"]["ramp_steps"] == 3
    assert any("teach_steps (4 and 1)" in d for d in plan_["differs"]), plan_["differs"]
    assert record["from_start"] and record["cooldown_flops"] == record["flops"] and record["steps"] == plan_["steps"]
    mine, theirs = weights(branch), weights(planned)
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)
    ledger = json.loads((planned / "growlm.json").read_text())["train"]
    assert record["final_val_loss"] == pytest.approx(ledger["final_val_loss"], rel=1e-6)
    assert record["flops"] == pytest.approx(ledger["flops"])  # the teachers' passes counted alike


def test_a_branch_whose_counts_are_steps_continues_the_kept_state_and_is_the_planned_run(made, tmp_path):
    """teach_steps: 2 and msg's ramp_steps: 3 given in steps: the branch plans what the full run planned, so it
    continues the state the refinement kept at its point (its ledger the refinement's up to there), and ends with
    the weights of the refinement its budget plans, trained from step 0."""
    import pandas as pd

    counts = "{grow: {options: {teach: {teach_steps: 2}, msg: {ramp_steps: 3}}}}"
    plan_, record, branch, planned = branch_and_planned_run(made, tmp_path, counts)
    assert not plan_["from_start"] and plan_["differs"] == []
    assert not record["from_start"] and record["cooldown_flops"] < record["flops"]
    mine, theirs = weights(branch), weights(planned)
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)
    cols = ["step", "tokens", "flops", "lr", "val_loss"]
    full = pd.read_csv(tmp_path / "full" / "ledger.csv")
    led = pd.read_csv(branch / "ledger.csv")
    pd.testing.assert_frame_equal(led[led["step"] <= plan_["step"]][cols].reset_index(drop=True),
                                  full[full["step"] <= plan_["step"]][cols].reset_index(drop=True))


def test_a_branch_plans_shares_of_its_own_budget_and_keeps_counts():
    """The rule of docs/methods.md, on the settings alone: shares (configured or msg's default fifth) of the
    branch's steps; counts kept, capped at the branch's length; the full run's settings untouched."""
    from growlm.branches import refine_branch

    def at(fraction, overlay):
        return refine_branch(tiny(overlay), METHOD, seed=0, budget=BUDGET, lr="0.003", fraction=fraction,
                             budgets=[BUDGET])

    early = at(0.2, "{grow: {options: {teach: {teach_steps: 30}, msg: {ramp_steps: 5}}}}")
    assert early["steps"] < 30 and early["refine_with"]["teach"]["teach_steps"] == early["steps"]  # 30, capped
    assert early["ramps"] == {"ramp_steps": 5} and early["from_start"]  # the full run teaches 30 steps
    late = at(0.95, "{grow: {options: {teach: {teach_steps: 0.5}}}}")
    assert late["refine_with"]["teach"]["teach_steps"] == int(0.5 * late["steps"]) and late["from_start"]
    assert late["train"]["tokens"] == late["tokens"] == late["steps"] * 8 * 32


def test_m0_extended_has_its_run_of_exactly_the_budget_among_its_finished_runs(made, tmp_path):
    """baseline.extend: 2 trains M_0 twice its budget; its branch at 1 is the run of exactly the budget, to the
    last digit of its ledger, and `baseline_ends` lists every finished run with the one at the budget."""
    import pandas as pd

    from growlm.branches import baseline_branch, baseline_ends, kept_steps
    from growlm.experiment import branch_points, large_settings, model_settings
    from growlm.jobs.train import cooldown, train_model

    torch.set_num_threads(1)
    budget = 8000  # 31 steps of 256 tokens
    config = tiny(f"{{train: {{large: {{tokens: {budget}}}, branches: [0.5]}}, baseline: {{extend: 2}}}}")
    points = branch_points(config, "large")
    assert points == {"50": 0.5, "100": 1.0, "150": 1.5}
    model = model_settings(config, n_embd=32, n_layer=2)
    m0 = tmp_path / "m0"
    train = large_settings(config, seed=0, tokens=budget, optim="0.003")
    assert train["tokens"] == 2 * budget
    kw = dict(model=model, init_seed=0, role="baseline M_0", **made["files"])
    train_model(train=train, out_dir=m0, branches=kept_steps(config, "baseline", seed=0, budget=budget, lr="0.003"),
                **kw)
    for point, fraction in points.items():
        branch = baseline_branch(config, seed=0, budget=budget, optim="0.003", fraction=fraction)
        cooldown(kind="baseline", branch=branch, state_dir=m0 / "branches" / f"b{point}" / "state",
                 out_dir=m0 / "branches" / f"b{point}", train=train, **kw)
    ends = baseline_ends(m0, budget=budget)
    assert [e["run"] for e in ends] == ["50", "100", "150", "full"]
    assert [e["at_budget"] for e in ends] == [False, True, False, False]
    assert ends[1]["tokens"] == 31 * 256 and ends[-1]["tokens"] == 62 * 256
    assert ends[0]["tokens"] < ends[1]["tokens"] < ends[2]["tokens"] < ends[3]["tokens"]
    assert all(e["flops"] > 0 and e["final_val_loss"] > 0 for e in ends)

    # M_0 planned for exactly the budget (extend 1): the same run as the branch at 1
    plain = tmp_path / "plain"
    one = tiny(f"{{train: {{large: {{tokens: {budget}}}, branches: []}}}}")
    train_model(train=large_settings(one, seed=0, tokens=budget, optim="0.003"), out_dir=plain, **kw)
    cols = ["step", "tokens", "flops", "lr", "train_loss", "val_loss"]
    branch, alone_led = pd.read_csv(m0 / "branches" / "b100" / "ledger.csv")[cols], pd.read_csv(plain / "ledger.csv")[cols]
    # every evaluation of the branch is the plain run's at that step, its end included (the plain run evaluates
    # once more, where its own decay begins: the extended run did not evaluate there)
    pd.testing.assert_frame_equal(branch, alone_led[alone_led["step"].isin(branch["step"])].reset_index(drop=True))
    assert branch["step"].iloc[-1] == alone_led["step"].iloc[-1] == 31
    (alone,) = baseline_ends(plain, budget=budget)
    assert alone["run"] == "full" and alone["at_budget"] and alone["final_val_loss"] == ends[1]["final_val_loss"]


def test_extend_and_branch_points_are_refused_in_one_line_before_any_job(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    cases = {"{baseline: {extend: 2}}": "baseline.extend = 2: M_0 trains under the cosine",
             "{train: {schedule: wsd, branches: [0.5, 1.5]}}": "train.branches = 1.5: a point at or past M_0's budget",
             "{train: {schedule: wsd}, baseline: {extend: 0.5}}": "baseline.extend = 0.5: not allowed",
             "{train: {schedule: wsd, refine: {branches: [1.2]}}}": "train.refine.branches[0] = 1.2: not allowed"}
    for i, (overlay, line) in enumerate(cases.items()):
        (wd / f"c{i}.yaml").write_text(overlay + "\n")
        error, _ = plan(wd, configfiles=(TINY, f"c{i}.yaml"))
        assert error is not None and line in error and "\n" not in error.strip(), error


def test_without_extend_m0_and_its_branches_are_what_they_were():
    """baseline.extend 1 (the default): M_0's settings are train.large's at the budget and its points
    train.branches alone, each branch the shortest wsd run decaying from its step, as before."""
    from growlm.branches import baseline_branch
    from growlm.experiment import branch_points, large_settings, train_settings
    from growlm.train_config import TrainConfig

    config = tiny()
    assert large_settings(config, seed=0, tokens=BUDGET, optim="0.003") == \
        train_settings(config, "large", seed=0, tokens=BUDGET, lr=0.003)
    assert branch_points(config, "large") == {"20": 0.2, "35": 0.35, "50": 0.5, "70": 0.7}
    full = TrainConfig.from_dict(large_settings(config, seed=0, tokens=BUDGET, optim="0.003"))
    for fraction in branch_points(config, "large").values():
        b = baseline_branch(config, seed=0, budget=BUDGET, optim="0.003", fraction=fraction)
        step = full.branch_step(fraction)
        assert (b["step"], b["steps"], b["from_start"]) == (step, full.branch(step).steps, False)
