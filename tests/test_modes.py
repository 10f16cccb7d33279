"""The mode every number was computed in (growlm.modes): torch.compile and the CPU threads change the last
digits, so every ledger row, every model's growlm.json, the comparison and the report's first page name it,
and a resume that changes it says so."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
import torch

import growlm.train as train_module
from conftest import learnable_tokens
from growlm.model import build_model
from growlm.train import train
from growlm.train_config import TrainConfig

V, T = 128, 16


def tiny_model():
    return build_model(seed=0, n_embd=32, n_layer=2, vocab_size=V, n_positions=T, head_dim=8)


def cfg(**kw):
    return TrainConfig(**{**dict(tokens=8 * T * 40, batch_size=8, context=T, lr=3e-3, warmup_steps=4, eval_interval=10,
                                 eval_tokens=1024, checkpoint_every=10, dense_log_steps=0, seed=1), **kw})


def test_a_mode_says_what_changes_the_last_digits_and_nothing_else():
    from growlm.modes import arm_mode, experiment_mode, job_mode, run_mode

    assert run_mode("cpu", None, threads=2) == "eager, 2 CPU threads"
    assert run_mode("cpu", "default", threads=1) == "compiled, 1 CPU thread"
    # compile_ramps concerns a model with ramps only; the CPU threads do not enter a GPU's sums, processes do
    assert run_mode("cpu", "default", threads=1, ramps=False) == "compiled (ramps eager), 1 CPU thread"
    assert run_mode("cuda:0", "max-autotune", threads=8, world=4, ramps=True) == \
        "compiled (max-autotune, ramps compiled), on cuda, 4 processes"
    assert run_mode("cpu", None, threads=1, ramps=True) == "eager, 1 CPU thread"  # nothing compiled, ramps or not
    assert job_mode(["eager, 1 CPU thread"] * 3 + ["compiled, 1 CPU thread"]) == \
        "eager, 1 CPU thread then compiled, 1 CPU thread"
    assert arm_mode({"members": ["eager, 1 CPU thread"] * 2, "growth": [], "refinement": ["eager, 1 CPU thread"]}) == \
        "eager, 1 CPU thread"
    assert arm_mode({"members": ["eager, 2 CPU threads", "eager, 1 CPU thread"], "growth": [],
                     "refinement": ["eager, 1 CPU thread"]}) == \
        "members: eager, 2 CPU threads and eager, 1 CPU thread; refinement: eager, 1 CPU thread"
    # train.compile on every model: the members and M_0 have no ramps, a refinement runs its ramps eagerly
    # (train.compile_ramps' default): one setting of every key, so one mode, not a warning on every GPU run
    compiled, ramped = "compiled, on cuda", "compiled (ramps eager), on cuda"
    assert arm_mode({"members": [compiled], "growth": [], "refinement": [ramped]}) == ramped
    assert experiment_mode([compiled, ramped, ramped]) == ramped
    assert experiment_mode([compiled, ramped, "compiled (ramps compiled), on cuda"]) is None  # compile_ramps changed
    assert experiment_mode([compiled, "eager, on cuda"]) is None
    assert experiment_mode([compiled, f"members: {compiled}; refinement: eager, on cuda"]) is None
    assert experiment_mode([compiled, f"{compiled} then eager, on cuda"]) is None


def test_a_resume_in_another_mode_says_so_in_one_line_and_the_ledger_keeps_both(tmp_path, monkeypatch):
    """An eager checkpoint resumed under compile, then on two threads: each resume names both modes, the
    ledger's rows keep the mode that computed them, and the summary (the job's growlm.json) names all three."""
    monkeypatch.setattr(train_module, "COMPILE_BACKEND", "eager")  # dynamo without code generation: the same mode
    data = learnable_tokens(V, 20000)

    class Killed(Exception):
        pass

    def kill_at(k):
        def callback(step):
            if step == k:
                raise Killed
        return callback

    threads = torch.get_num_threads()
    messages = []
    try:
        torch.set_num_threads(1)
        with pytest.raises(Killed):  # eager, killed after step 15: the checkpoint of step 10 stays
            train(tiny_model(), data, data, cfg(), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "l.csv",
                  log=messages.append, step_callback=kill_at(15))
        with pytest.raises(Killed):  # compiled from step 10, killed after step 25
            train(tiny_model(), data, data, cfg(compile=True), ckpt_dir=tmp_path / "ck",
                  ledger_path=tmp_path / "l.csv", log=messages.append, step_callback=kill_at(25))
        torch.set_num_threads(2)
        summary = train(tiny_model(), data, data, cfg(compile=True), ckpt_dir=tmp_path / "ck",
                        ledger_path=tmp_path / "l.csv", log=messages.append)
    finally:
        torch.set_num_threads(threads)
    said = [m for m in messages if "another mode" in m]
    assert said == [
        "resuming at step 10 in another mode: the steps so far were computed eager, 1 CPU thread, the rest will be "
        "compiled, 1 CPU thread (train.compile, train.compile_ramps or train.threads changed): the result differs in "
        "its last digits from a run in one mode; the ledger, growlm.json, the comparison and the report name both "
        "modes",
        "resuming at step 20 in another mode: the steps so far were computed compiled, 1 CPU thread, the rest will be "
        "compiled, 2 CPU threads (train.compile, train.compile_ramps or train.threads changed): the result differs "
        "in its last digits from a run in one mode; the ledger, growlm.json, the comparison and the report name both "
        "modes"], messages
    rows = {int(r["step"]): r["mode"] for r in csv.DictReader(open(tmp_path / "l.csv"))}
    assert rows == {0: "eager, 1 CPU thread", 10: "eager, 1 CPU thread", 20: "compiled, 1 CPU thread",
                    30: "compiled, 2 CPU threads", 40: "compiled, 2 CPU threads"}
    assert summary["mode"] == "eager, 1 CPU thread then compiled, 1 CPU thread then compiled, 2 CPU threads"


@pytest.mark.slow
def test_every_model_of_a_run_records_its_mode_and_the_report_says_it(tiny_run):
    """The tiny experiment runs eagerly on one thread per job (train.threads: 1): every ledger row and every
    model's growlm.json say so, the comparison gives each arm's mode, and the first page says once that all
    models share it."""
    res = tiny_run / "results" / "tiny"
    one = "eager, 1 CPU thread"
    ledgers = sorted((res / "models").rglob("ledger.csv"))
    assert len(ledgers) >= 6  # 2 members, M_0, 3 refinements
    for ledger in ledgers:
        assert set(pd.read_csv(ledger)["mode"]) == {one}, ledger
        assert json.loads((ledger.parent / "growlm.json").read_text())["train"]["mode"] == one, ledger
    comparison = pd.read_csv(res / "eval" / "comparison.csv")
    assert set(comparison["m0_mode"]) == {one} and set(comparison["m1_mode"]) == {one}
    assert f"The models were all computed in one mode: {one}." in (res / "report" / "summary.rst").read_text()
    assert "M_1 computed" in (res / "report" / "comparison.html").read_text()
