"""The learning-rate schedules (train.schedule: cosine, wsd) and growth from a member before its decay
(members.source: before_decay).

The cosine is growlm's schedule as it always was, to the last bit (its params too, so a finished
experiment reruns nothing); wsd holds the peak and decays the last share of the steps to the same floor
in the shape asked for; a schedule a stage cannot take is named before any job runs; a member trained
under wsd keeps its model where the decay began, with the cost of its training up to there, and every
operator that reads members grows from it when asked. (A wsd job killed in its decay resuming to the same
numbers: tests/test_kill_resume.py.)
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

from conftest import TINY, plan
from growlm.errors import GrowlmError
from growlm.methods import METHODS, OPERATORS
from growlm.train_config import TrainConfig


def cosine_as_it_was(step: int, cfg: TrainConfig) -> float:
    """growlm.train.lr_at before there was a choice of schedule, verbatim."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    end = cfg.steps if cfg.decay_share >= 1 else max(cfg.warmup_steps + 1, int(cfg.steps * cfg.decay_share))
    progress = (step - cfg.warmup_steps) / max(1, end - cfg.warmup_steps)
    progress = min(1.0, progress)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("steps,warmup,share", [(100, 10, 1.0), (73, 20, 1.0), (300, 0, 2 / 3), (195, 5, 1.0),
                                                (7, 9, 1.0)])
def test_the_cosine_is_what_it_was_to_the_last_bit_and_its_params_too(steps, warmup, share):
    cfg = TrainConfig(tokens=steps * 64, batch_size=1, context=64, lr=1.2e-3, warmup_steps=warmup, decay_share=share,
                      min_lr_ratio=0.1)
    assert cfg.schedule == "cosine" and cfg.decay_start is None
    assert [cfg.lr_at(s) for s in range(steps + 3)] == [cosine_as_it_was(s, cfg) for s in range(steps + 3)]
    # a cosine run's params and checkpoint identity are those of a run made before wsd existed: no new key
    settings = cfg.run_settings()
    assert not {"schedule", "wsd_decay", "wsd_shape"} & set(settings)
    assert cfg.with_(wsd_decay=0.5, wsd_shape="linear").run_settings() == settings  # read by wsd only
    assert {"schedule", "wsd_decay", "wsd_shape"} <= set(cfg.with_(schedule="wsd").run_settings())


@pytest.mark.parametrize("shape,mid", [("linear", 0.5), ("cosine", 0.5), ("1-sqrt", 1 - math.sqrt(0.5))])
def test_wsd_holds_the_peak_then_decays_its_last_share_to_the_cosines_floor(shape, mid):
    lr, floor = 1.0, 0.1
    cfg = TrainConfig(tokens=100 * 64, batch_size=1, context=64, lr=lr, warmup_steps=10, schedule="wsd",
                      wsd_decay=0.2, wsd_shape=shape, min_lr_ratio=floor)
    assert cfg.decay_start == 80
    rates = [cfg.lr_at(s) for s in range(101)]
    assert rates[:10] == [cosine_as_it_was(s, cfg) for s in range(10)]  # the cosine's warm-up
    assert all(r == lr for r in rates[10:81])  # the peak, up to and including the decay's first step
    assert rates[90] == pytest.approx(floor + (lr - floor) * mid)  # half way through the decay
    assert rates[100] == pytest.approx(floor) and all(a > b for a, b in zip(rates[80:100], rates[81:101]))
    # LEMON's faster decay (decay_share): the whole schedule, its decay included, ends at that share
    lemon = cfg.with_(decay_share=0.5)
    assert lemon.decay_end == 50 and lemon.decay_start == 40
    assert lemon.lr_at(39) == lr and lemon.lr_at(50) == lemon.lr_at(99) == pytest.approx(floor)


def test_a_wsd_run_that_cannot_take_its_schedule_is_refused_naming_why():
    cfg = TrainConfig(tokens=20 * 64, batch_size=1, context=64, lr=1e-3, warmup_steps=18, schedule="wsd")
    assert cfg.decay_start == 16
    with pytest.raises(GrowlmError, match="would begin at step 16, inside its warm-up of 18 steps"):
        cfg.validate()
    with pytest.raises(GrowlmError, match="unknown wsd decay shape 'exp'"):
        cfg.with_(warmup_steps=2, wsd_shape="exp").validate()


def test_a_schedule_a_stage_cannot_take_is_named_at_the_dry_run(workflow_dir):
    """Every stage's schedule is checked before any job: the members' wsd decay inside their warm-up
    names train.small, a refinement's names the method and budget, and growth before the decay of
    members that have none names members.source; all in one message (the workflow parsed in this process:
    conftest's `plan`)."""
    (workflow_dir / "bad.yaml").write_text(
        "train: {small: {warmup_steps: 45, schedule: wsd}, refine: {warmup_steps: 90, schedule: wsd}}\n"
        "members: {source: before_decay}\n")
    out, _ = plan(workflow_dir, configfiles=(TINY, "bad.yaml"))
    assert out is not None
    assert "train.small (the members): its wsd decay (9 of 46 steps) would begin at step 37, inside its warm-up " \
           "of 45 steps" in out
    assert "train.refine (hyperclone+zero_block, budget 24000): its wsd decay" in out
    (workflow_dir / "bad.yaml").write_text("members: {source: before_decay}\n")
    out, _ = plan(workflow_dir, configfiles=(TINY, "bad.yaml"))
    assert out is not None and "members.source = before_decay: the members train under the cosine" in out, out


# ------------------------------------------------------------------------------------------------
# growth before the decay
# ------------------------------------------------------------------------------------------------

CTX, STEPS = 16, 40


@pytest.fixture(scope="module")
def wsd_members(tmp_path_factory):
    """Two members d16 L1 trained by the members' job under wsd (40 steps, decaying from step 32), as the
    workflow trains them (keep_moments: their moments kept for carry), and the data they used."""
    from growlm.jobs.train import train_model
    from growlm.tokenizer import fit_tokenizer

    root = tmp_path_factory.mktemp("wsd_members")
    text = root / "train.txt"
    text.write_text("\n".join(["the cat sat on the mat", "see the dog run", "a red hen"] * 50))
    fit_tokenizer([text], root / "tok", vocab_size=300)
    rng = np.random.default_rng(0)
    tokens = (np.arange(20000) % 97 + rng.integers(0, 3, 20000)).astype(np.uint16)
    np.save(root / "t.npy", tokens)
    train = TrainConfig(tokens=8 * CTX * STEPS, batch_size=8, context=CTX, lr=3e-3, warmup_steps=4, eval_interval=10,
                        eval_tokens=512, checkpoint_every=100, dense_log_steps=0, seed=1, schedule="wsd",
                        wsd_decay=0.2).run_settings()
    model = {"n_embd": 16, "n_layer": 1, "n_positions": CTX, "head_dim": 8, "tie_word_embeddings": True}
    dirs = []
    for i in (1, 2):
        out = root / "results" / "models" / "small" / f"m{i}"
        train_model(train={**train, "seed": 10 + i}, model=model, init_seed=i, role=f"small member m{i}",
                    train_file=root / "t.npy", val_file=root / "t.npy", tokenizer_dir=root / "tok", out_dir=out,
                    keep_moments=True)
        dirs.append(out)
    return root, dirs


def test_a_wsd_member_keeps_its_model_where_its_decay_began_with_that_cost(wsd_members):
    """The member's folder holds, beside the annealed member, the model of step 32: its ledger ends with
    the evaluation made there, which the kept weights reproduce; its cost is its training up to there; its
    moments are those of step 32."""
    from growlm.loss import evaluate
    from growlm.model import load_model
    from growlm.optim_state import MEMBER_MOMENTS_FILE, load_moments

    root, dirs = wsd_members
    annealed, before = dirs[0], dirs[0] / "before_decay"
    ledger = list(csv.DictReader(open(before / "ledger.csv")))
    assert [r["step"] for r in ledger] == ["0", "10", "20", "30", "32"]
    assert ledger == list(csv.DictReader(open(annealed / "ledger.csv")))[:5]
    meta, full = json.loads((before / "growlm.json").read_text()), json.loads((annealed / "growlm.json").read_text())
    assert meta["before_decay"] == {"step": 32, "of": STEPS, "annealed": str(annealed)}
    assert meta["train"]["flops"] == int(ledger[-1]["flops"]) == full["train"]["flops"] * 32 // STEPS
    assert meta["train"]["tokens"] == 32 * 8 * CTX and meta["role"] == full["role"]
    tokens = np.load(root / "t.npy")
    loss = evaluate(load_model(before), tokens, context=CTX, batch_size=8, max_tokens=512, device="cpu")["loss"]
    assert round(loss, 5) == float(ledger[-1]["val_loss"])
    assert round(evaluate(load_model(annealed), tokens, context=CTX, batch_size=8, max_tokens=512,
                          device="cpu")["loss"], 5) != float(ledger[-1]["val_loss"])
    assert load_moments(before / MEMBER_MOMENTS_FILE)[1] == 32 and load_moments(annealed / MEMBER_MOMENTS_FILE)[1] == 40


def _route(name: str) -> tuple[str, dict]:
    """A method through operator `name` from 2 members (16 wide, 1 deep) to 32 wide, 2 deep, and its options."""
    info = OPERATORS[name]
    if info.axis == "refine":  # teach, freeze, carry ride on a growth operator
        return f"msg+{name}", {}
    if name in ("merge", "stack_members"):
        return {"merge": "merge+msg", "stack_members": "hyperclone+stack_members"}[name], {}
    if name == "concat":
        return "concat+zero_block", {}
    if info.learned:
        return name, {"steps": 2}
    return {"depth": f"hyperclone+{name}", "width": f"{name}+zero_block"}.get(info.kind, name), {}


MEMBER_READING = [m for m in METHODS if OPERATORS[m].axis != "schedule"]


@pytest.mark.parametrize("name", MEMBER_READING)
def test_every_member_reading_operator_grows_from_members_before_their_decay(wsd_members, name, tmp_path):
    """Grown from the members' folders `members.source: before_decay` names: the record counts each
    member's training up to its decay and names the folders its refiners read (teach's teachers, carry's
    moments of step 32), and the grown model is the one the operator makes from the kept models, not
    from the annealed ones (an exact operator computes what the kept m_1 computes)."""
    from growlm.growth import load_grown
    from growlm.growth_record import Growth
    from growlm.jobs.grow import grow
    from growlm.jobs.train import refiner_settings
    from growlm.methods import members_used, method_chain
    from growlm.model import load_model

    root, dirs = wsd_members
    method, options = _route(name)
    learned = {"batch_size": 4, "context": CTX}

    def grown_from(members, out):
        grow(member_dirs=[str(d) for d in members], method=method, n_embd=32, n_layer=2, seed=0, options=options,
             out_dir=out, data_file=root / "t.npy", learned_batches=learned)
        return Growth.read(out), load_grown(out)

    before = [d / "before_decay" for d in dirs]
    growth, model = grown_from(before, tmp_path / "before")
    used = before[:members_used(method_chain(method), 2)]
    costs = [json.loads((d / "growlm.json").read_text())["train"]["flops"] for d in used]
    assert [(m["dir"], m["flops"]) for m in growth.members] == [(str(d), c) for d, c in zip(used, costs)]
    annealed = [json.loads((d / "growlm.json").read_text())["train"]["flops"] for d in dirs]
    assert all(c < a for c, a in zip(costs, annealed))
    if name == "carry":
        assert growth.provided["moments_step"] == 32
    refine_with = {r: {**{k: 5 for k in OPERATORS[r].ramps}, **OPERATORS[r].options} for r in method_chain(method)
                   if OPERATORS[r].axis == "refine"}
    refiners = refiner_settings(refine_with, growth, tmp_path / "before", steps=20)
    if "teach" in refiners:
        assert refiners["teach"]["teachers"] == [str(d) for d in used]
    x = torch.from_numpy(np.load(root / "t.npy")[:3 * CTX].astype("int64")).reshape(3, CTX)
    with torch.no_grad():
        logits = model(input_ids=x).logits
        other = grown_from(dirs, tmp_path / "annealed")[1](input_ids=x).logits
        assert not torch.allclose(logits, other, atol=1e-4)
        if OPERATORS[name].exact and all(OPERATORS[n].exact for n in method_chain(method)) and "concat" not in method:
            assert torch.allclose(logits, load_model(before[0])(input_ids=x).logits, atol=1e-4)


def test_the_comparison_and_the_first_page_say_where_the_members_were_grown_from(wsd_members, tmp_path):
    """The comparison names the point of growth (and each arm's schedule); the report's first page says
    it, with M_0's budget per parameter, beside the cost ratio it counts."""
    import pandas as pd

    from growlm.compare import grown_from, members_schedule, schedule_of
    from growlm.growth_record import Growth
    from growlm.jobs.grow import grow
    from growlm.report import summary_sentences

    root, dirs = wsd_members
    for source, out in ((dirs, tmp_path / "annealed"), ([d / "before_decay" for d in dirs], tmp_path / "before")):
        grow(member_dirs=[str(d) for d in source], method="msg_members", n_embd=32, n_layer=2, seed=0, options={},
             out_dir=out)
    assert grown_from(Growth.read(tmp_path / "annealed")) == "annealed"
    assert grown_from(Growth.read(tmp_path / "before")) == "before decay (step 32 of 40)"
    assert schedule_of(dirs[0]) == "wsd (last 20%, 1-sqrt)" and schedule_of(tmp_path / "before") == ""
    assert members_schedule([{"dir": str(d)} for d in dirs]) == "wsd (last 20%, 1-sqrt)"
    row = {"d0": 16, "L0": 1, "d1": 32, "L1": 2, "n": 2, "budget": 5120, "seed": 0, "method": "msg_members",
           "arm": "grown from n members", "members_used": 2, "reached": True, "cost_ratio": 0.7,
           "cost_ratio_small_free": 0.6, "m0_final_val_loss": 5.0, "m1_final_val_loss": 4.9,
           "tokens_per_param": 0.41, "tokens_per_param_total": 0.2, "m0_schedule": "wsd (last 20%, 1-sqrt)",
           "m1_schedule": "wsd (last 20%, 1-sqrt)", "members_grown_from": "before decay (step 32 of 40)"}
    pd.DataFrame([row]).to_csv(tmp_path / "comparison.csv", index=False)
    text = " ".join(summary_sentences(tmp_path / "comparison.csv"))
    assert ("trained from scratch for 5,120 tokens (0.41 tokens per non-embedding parameter, 0.2 per parameter) under "
            "the wsd (last 20%, 1-sqrt) schedule, the members grown where their wsd decay began (step 32 of 40; their "
            "training up to there is the cost counted, the annealed members are evaluated) ends at") in text
    assert "growing paid. M_1 reached M_0's final validation loss at 0.70 of M_0's FLOPs" in text
    # members of another schedule than M_0's are named (the comparison reads each arm's from its models)
    pd.DataFrame([{**row, "members_schedule": "cosine", "members_grown_from": "annealed"}]).to_csv(
        tmp_path / "comparison.csv", index=False)
    assert "under the wsd (last 20%, 1-sqrt) schedule (the members: cosine) ends at" in " ".join(
        summary_sentences(tmp_path / "comparison.csv"))
