"""Cost by envelope in the workflow: under wsd every large job keeps its state at the points of train.branches,
a cooldown job per point decays from there, and the comparison, savings.csv and the report's first page read
them; the states go once read, and a finished run has nothing left to do. Without branches, nothing changes."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from conftest import TINY, copy_workflow, finished_run, job_counts, plan, planned_counts, run_output

WSD = """\
train:
  schedule: wsd
  branches: [0.35, 0.7]  # two of the default four points: a cooldown job each is what is checked
  refine: {warmup_steps: 3, branches: [0.35, 0.7]}  # ... and of the refinement's six
  small: {schedule: cosine}  # the tiny run's members as they are: no member trains again
methods: [msg]
grow: {options: {msg: {ramp_steps: 4}}}  # a count: each branch plans the full run's ramp, so it continues its state
controls: {single_member: false, ensemble: false}
profile: {tools: []}
"""


@pytest.fixture(scope="module")
def wsd_run(tiny_run, tmp_path_factory):
    """The tiny experiment's large jobs under wsd, in a copy of the finished tiny run less its large models: its
    corpus, tokenizer, token files and members (still under the cosine) are the tiny run's; M_0 and the
    refinement train again. (The run, and the plan it said as it started.)"""
    made = ("models/baseline", "models/grown", "models/refined", "checkpoints", "report", "profile", "live")
    wd = finished_run(tmp_path_factory, "wsd", [["--cores", "2", "--configfile", str(TINY), "wsd.yaml"]],
                      files={"wsd.yaml": WSD},
                      start_from=tiny_run, remove=tuple(f"results/tiny/{folder}" for folder in made))
    return wd, run_output(wd, 0).read_text()


def test_every_large_job_has_a_cooldown_per_point_and_a_finished_run_is_done(wsd_run):
    wd, said = wsd_run
    counts = job_counts(said)
    assert counts["cooldown_baseline"] == 2 and counts["cooldown_refine"] == 2  # 0.35, 0.7
    results = wd / "results" / "tiny"
    for model in (results / "models" / "baseline").glob("*/*/s0"):
        assert sorted(p.name for p in (model / "branches").iterdir()) == ["b35", "b70"]
        for b in (model / "branches").iterdir():
            assert not (b / "state").exists()  # temporary: gone once its cooldown read it
    assert plan(wd, configfiles=(TINY, "wsd.yaml")) == (None, [])  # nothing to be done (in this process)


def test_a_branch_is_the_shorter_wsd_run_sharing_the_full_runs_steps(wsd_run):
    from growlm.train_config import TrainConfig

    wd, _ = wsd_run
    models = wd / "results" / "tiny" / "models"
    for model in [*models.glob("baseline/*/*/s0"), *models.glob("refined/*/*/*/*/s0")]:
        meta = json.loads((model / "growlm.json").read_text())
        full = TrainConfig.from_dict(meta["train"]["config"])
        ledger = pd.read_csv(model / "ledger.csv")
        for fraction, point in ((0.35, "b35"), (0.7, "b70")):
            record = json.loads((model / "branches" / point / "branch.json").read_text())
            step = full.branch_step(fraction)
            assert (record["step"], record["steps"]) == (step, full.branch(step).steps)
            branch = pd.read_csv(model / "branches" / point / "ledger.csv")
            assert int(branch["step"].iloc[-1]) == record["steps"]
            assert branch["val_loss"].iloc[-1] == record["final_val_loss"]
            shared = ["step", "tokens", "flops", "lr", "val_loss"]
            pd.testing.assert_frame_equal(branch[branch["step"] <= step][shared].reset_index(drop=True),
                                          ledger[ledger["step"] <= step][shared].reset_index(drop=True))
            per_step = meta["train"]["flops"] / full.steps  # no refiner here: the same FLOPs every step
            assert record["flops"] == pytest.approx(per_step * record["steps"])
            assert record["cooldown_flops"] == pytest.approx(per_step * (record["steps"] - step))


def test_the_comparison_and_the_first_page_give_the_cost_by_envelope(wsd_run):
    wd, _ = wsd_run
    results = wd / "results" / "tiny"
    row = pd.read_csv(results / "eval" / "comparison.csv").iloc[0]
    assert row["envelope_runs"] == "3+3" and row["envelope_joined"] == "hull"  # three ends: too few to fit
    # M_0's envelope of finished runs reaches its own final loss no later than its own run does
    assert row["m0_envelope_flops"] <= row["m0_flops"] * (1 + 1e-12)
    # the multiplier: M_0's three finished runs fitted; one seed gives no interval, and no saving is stated
    assert row["m0_points"] == 3 and row["m1_seeds"] == 1 and row["multiplier_free"] > 0
    assert math.isnan(row["multiplier_low"]) and row["seed_multiplier"] == pytest.approx(row["multiplier"])
    assert 0 < row["m0_final_val_loss_se"] < 0.1 and 0 < row["m1_final_val_loss_se"] < 0.1
    curves = pd.read_csv(results / "eval" / "curves.csv")
    for arm in ("M_0 (scratch)", "M_1 (msg)"):
        runs = curves[curves["arm"] == arm]
        assert sorted(runs["run"].unique()) == ["branch 0.35", "branch 0.7", "full"]
        ends = runs[runs["is_end"]]
        assert len(ends) == 3 and ends["val_loss_se"].gt(0).all()  # each run's end, with its standard error
    # the evaluation's error: every run kept its last evaluation's window losses beside its ledger; M_1 is paired
    # with M_0's finished run nearest its loss, and the difference's error is far under either loss's own
    from growlm.runs import eval_error, final_windows, paired_windows

    for ledger in (results / "models").rglob("ledger.csv"):
        assert final_windows(ledger) is not None, ledger
    m1_dir, m0_dir = next(results.glob("models/refined/*/*/*/*/s0")), next(results.glob("models/baseline/*/*/s0"))
    se, windows = eval_error([paired_windows(m1_dir, [m0_dir], ["35", "70"])])
    assert (row["eval_se"], row["eval_windows"]) == (pytest.approx(se), windows) and windows >= 2
    assert 0 < row["eval_se"] < min(row["m0_final_val_loss_se"], row["m1_final_val_loss_se"])
    cooldowns = sum(json.loads(f.read_text())["cooldown_flops"]
                    for f in (results / "models").rglob("branch.json"))
    assert row["cooldown_flops"] == pytest.approx(cooldowns)
    assert row["m0_passes"] > 0 and row["members_passes"] > 0 and row["m0_weight_decay"] == 0.1
    savings = pd.read_csv(results / "eval" / "savings.csv")
    assert len(savings) and set(savings["method"]) == {"msg"}
    summary = (results / "report" / "summary.rst").read_text()
    assert "By envelope (each arm's finished runs" in summary
    assert "no measurable saving: effective compute multiplier" in summary and "no interval" in summary
    assert 'id="growlm-savings"' in summary and (results / "report" / "savings.svg").stat().st_size > 1000
    assert "passes over its training text" in summary


def test_without_branches_no_cooldown_is_planned(tmp_path):
    """Planned in this process (conftest's `plan`)."""
    wd = copy_workflow(tmp_path / "wf")
    (wd / "wsd.yaml").write_text(WSD.replace("branches: [0.35, 0.7]", "branches: []"))
    counts = planned_counts(wd, configfiles=(TINY, "wsd.yaml"))
    assert "cooldown_baseline" not in counts and "cooldown_refine" not in counts and counts["train_baseline"] == 1
    (wd / "bad.yaml").write_text(WSD.replace("branches: [0.35, 0.7]", "branches: [0.01]"))
    error, _ = plan(wd, configfiles=(TINY, "bad.yaml"))
    assert error is not None and "train.branches = 0.01" in error, error


def test_the_cooldown_job_at_the_decay_start_is_the_tiny_experiments_m0_to_the_last_bit(wsd_run, tmp_path):
    """The jobs' own functions on the tiny experiment's data: M_0 keeping its state where its decay begins (the
    point 1.0 of its stable phase), and the cooldown job from there, which is then the complete run of M_0's
    own budget: its ledger is the workflow's M_0's, row for row, the losses to the last digit written."""
    import torch

    from growlm.jobs.train import cooldown, train_model
    from growlm.train_config import TrainConfig

    wd, _ = wsd_run
    results = wd / "results" / "tiny"
    m0 = next((results / "models" / "baseline").glob("*/*/s0"))
    meta = json.loads((m0 / "growlm.json").read_text())
    train = {k: v for k, v in meta["train"]["config"].items() if k not in
             ("device", "micro_batch_size", "recompute_every", "strategy", "compile", "compile_ramps", "sync_every",
              "peak_flops", "save_moments", "inputs")}
    model = {"n_embd": 32, "n_layer": 2, "n_positions": 32, "head_dim": 8, "tie_word_embeddings": True}  # tiny.yaml's
    files = dict(train_file=results / "tokens/level1/train.npy", val_file=results / "tokens/level1/val.npy",
                 tokenizer_dir=results / "tokenizer")
    torch.set_num_threads(1)
    out = tmp_path / "models" / "m0"
    full = TrainConfig.from_dict(train)
    train_model(train=train, model=model, init_seed=0, role="baseline M_0", out_dir=out,
                branches={"100": full.decay_start}, **files)
    state = out / "branches" / "b100" / "state"
    assert state.is_dir()
    branch = {"fraction": 1.0, "step": full.decay_start, "steps": full.steps, "from_start": False}
    cooldown(kind="baseline", branch=branch, state_dir=state, out_dir=tmp_path / "models" / "m0" / "branches" / "b100",
             train=train, model=model, init_seed=0, role="baseline M_0", **files)
    cols = ["step", "tokens", "flops", "lr", "train_loss", "val_loss"]
    workflow_m0 = pd.read_csv(m0 / "ledger.csv")[cols]
    pd.testing.assert_frame_equal(pd.read_csv(out / "ledger.csv")[cols], workflow_m0)
    pd.testing.assert_frame_equal(pd.read_csv(out / "branches" / "b100" / "ledger.csv")[cols], workflow_m0)
