"""Cost by envelope (growlm.envelope): a wsd run's cooldown branches are complete shorter wsd runs, the
branch taken where the run's own decay begins is the run to the last bit, and the envelope's crossing is
never above the first crossing of the full run's curve (and can be strictly below it)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from growlm.compare import first_reach
from growlm.envelope import covered, crossing, lowest, point_id, reach, saving_curve
from growlm.errors import GrowlmError
from growlm.model import build_model
from growlm.train import train
from growlm.train_config import TrainConfig

from conftest import learnable_tokens


def wsd(tokens=8 * 16 * 60, **kw) -> TrainConfig:
    return TrainConfig(**{"tokens": tokens, "batch_size": 8, "context": 16, "lr": 3e-3, "warmup_steps": 4,
                          "eval_interval": 10, "eval_tokens": 512, "checkpoint_every": 7, "dense_log_steps": 0,
                          "seed": 3, "schedule": "wsd", "wsd_decay": 0.2, **kw})


@pytest.mark.parametrize("kw", [{}, {"wsd_decay": 0.35}, {"wsd_shape": "linear"}, {"decay_share": 0.8},
                                {"tokens": 8 * 16 * 1000, "wsd_decay": 0.1}])
def test_a_branch_is_the_complete_wsd_run_that_decays_from_its_step(kw):
    full = wsd(**kw)
    for step in range(full.warmup_steps, full.decay_start + 1):
        branch = full.branch(step)
        assert branch.decay_start == step
        assert branch.steps <= full.steps
        # every step before the branch's decay has the full run's rate: the branch continues its state
        assert [branch.lr_at(t) for t in range(step)] == [full.lr_at(t) for t in range(step)]
        # it decays to the same floor over its own share of its steps, with the same shape
        decay = [branch.lr_at(t) for t in range(step, branch.steps)]
        assert decay == sorted(decay, reverse=True) and decay[0] <= full.lr
        assert branch.wsd_shape == full.wsd_shape and branch.wsd_decay == full.wsd_decay
        assert math.isclose(branch.lr_at(branch.decay_end), full.lr_at(full.decay_end))
    assert full.branch(full.decay_start) is full


def test_a_branch_outside_the_stable_phase_or_under_the_cosine_is_refused():
    full = wsd()
    with pytest.raises(GrowlmError, match="stable phase"):
        full.branch(full.warmup_steps - 1)
    with pytest.raises(GrowlmError, match="stable phase"):
        full.branch(full.decay_start + 1)
    with pytest.raises(GrowlmError, match="wsd"):
        full.with_(schedule="cosine").branch(10)
    assert point_id(0.35) == "35" and point_id(0.2) == "20" and point_id(0.125) == "12.5"


def _train(cfg, out, **kw):
    torch.manual_seed(0)
    model = build_model(seed=0, n_embd=32, n_layer=2, vocab_size=128, n_positions=16, head_dim=8)
    tokens = learnable_tokens(128)
    summary = train(model, tokens, tokens, cfg, ckpt_dir=out / "ckpt", ledger_path=out / "ledger.csv",
                    log=lambda *_: None, **kw)
    return model, summary


def test_a_branch_at_the_decay_start_is_the_full_run_to_the_last_bit(tmp_path):
    torch.set_num_threads(1)
    full = wsd()
    early = full.branch_step(0.35)
    reference, summary = _train(full, tmp_path / "full",
                                keep_at={full.decay_start: "branch_decay", early: "branch_35"})
    kept = tmp_path / "full" / "ckpt"
    assert (kept / "branch_decay").is_dir() and (kept / "branch_35").is_dir()
    assert summary["decay_start_flops"] == pytest.approx(summary["flops"] * full.decay_start / full.steps)

    # the branch at the full run's decay start: the same settings, from its kept state: the same model
    same, _ = _train(full, tmp_path / "same", start_from=kept / "branch_decay", start_cfg=full)
    for (name, a), (_, b) in zip(reference.state_dict().items(), same.state_dict().items()):
        assert torch.equal(a, b), name
    led_full = pd.read_csv(tmp_path / "full" / "ledger.csv")
    led_same = pd.read_csv(tmp_path / "same" / "ledger.csv")
    cols = ["step", "tokens", "flops", "lr", "train_loss", "val_loss"]
    assert led_same[cols].equals(led_full[cols])

    # an earlier branch: a shorter complete run, its ledger the full run's up to the branch, then its decay
    branch = full.branch(early)
    _, short = _train(branch, tmp_path / "short", start_from=kept / "branch_35", start_cfg=full)
    led = pd.read_csv(tmp_path / "short" / "ledger.csv")
    assert int(led["step"].iloc[-1]) == branch.steps and short["steps"] == branch.steps
    # its end is a run's end: evaluated on the whole validation split (every whole window), the rows before on 512
    evals = led[led["kind"] == "eval"]
    assert list(evals["val_tokens"]) == [512] * (len(evals) - 1) + [(learnable_tokens(128).size - 1) // 16 * 16]
    before = led[led["step"] <= early]
    assert before[cols].equals(led_full[led_full["step"] <= early][cols].reset_index(drop=True))
    assert led["lr"].iloc[-1] == pytest.approx(branch.lr_at(branch.steps - 1))
    assert led["lr"].iloc[-1] < full.lr / 2  # it decayed

    # the state of another run is refused, in one line naming it
    with pytest.raises(GrowlmError, match="not that of this branch's run"):
        _train(branch, tmp_path / "other", start_from=kept / "branch_35", start_cfg=full.with_(lr=1e-3))


def test_a_resume_never_passes_a_state_it_must_keep(tmp_path):
    """A run whose checkpoints are past a branch point it has not kept (killed before growlm kept branch
    states, say) passes that point again rather than finishing without the state."""
    torch.set_num_threads(1)
    full = wsd()
    _train(full.with_(checkpoint_every=5), tmp_path / "run", step_callback=None)
    # no checkpoint is left after a finished run in the workflow; here the loop leaves its last two
    ckpts = sorted((tmp_path / "run" / "ckpt").glob("step_*"))
    assert ckpts
    lines = []
    model = build_model(seed=0, n_embd=32, n_layer=2, vocab_size=128, n_positions=16, head_dim=8)
    tokens = learnable_tokens(128)
    step = full.branch_step(0.5)
    train(model, tokens, tokens, full.with_(checkpoint_every=5), ckpt_dir=tmp_path / "run" / "ckpt",
          ledger_path=tmp_path / "run" / "ledger2.csv", log=lines.append, keep_at={step: "branch_50"})
    assert any("the state kept at step" in line for line in lines)
    assert (tmp_path / "run" / "ckpt" / "branch_50").is_dir()


# --- the envelope --------------------------------------------------------------------------------

def _curve(rng, start, floor, n=12, scale=1e9):
    """A decreasing noisy loss curve against FLOPs, as a ledger."""
    flops = np.sort(rng.uniform(0, 1, n)) * scale
    flops[0] = 0.0
    loss = floor + (start - floor) * np.exp(-flops / scale * rng.uniform(2, 5)) + rng.normal(0, 0.02, n)
    return pd.DataFrame({"step": range(n), "flops": flops, "val_loss": loss})


def test_the_envelope_is_never_above_the_first_crossing():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        curve = _curve(rng, 6.0, 3.0)
        target = rng.uniform(3.0, 6.0)
        full = list(zip(curve["flops"], curve["val_loss"]))
        # branches: the full run's points up to where each leaves, then a few lower or higher ones
        branches = []
        for _ in range(rng.integers(0, 4)):
            k = int(rng.integers(1, len(full)))
            tail = [(full[k - 1][0] * (1 + j * 0.1), full[k - 1][1] + rng.normal(-0.1, 0.1)) for j in (1, 2)]
            branches.append(full[:k] + tail)
        crossing_full = first_reach(curve, target)
        if math.isnan(crossing_full):
            continue
        assert reach([full, *branches], target) <= crossing_full * (1 + 1e-12), target
        checked += 1
    assert checked > 100


def test_a_branch_that_ends_lower_moves_the_crossing_strictly_earlier():
    # the full run reaches 4.0 only near its end; a cooldown branch leaving it at 2e9 ends at 3.9 by 2.5e9
    curve = pd.DataFrame({"step": [0, 1, 2, 3, 4], "flops": [0.0, 1e9, 2e9, 3e9, 4e9],
                          "val_loss": [7.0, 5.0, 4.6, 4.3, 3.95]})
    full = list(zip(curve["flops"], curve["val_loss"]))
    branch = full[:3] + [(2.5e9, 3.9)]
    first = first_reach(curve, 4.0)
    found = reach([full, branch], 4.0)
    assert found < first
    # between where the branch left (2e9, 4.6) and its end, read in log FLOPs
    assert found == pytest.approx(math.exp(math.log(2e9) + (4.6 - 4.0) / (4.6 - 3.9) * math.log(2.5e9 / 2e9)))
    assert crossing(full, 4.0) <= first  # the full run alone, read in log FLOPs, is not above it either
    assert math.isnan(reach([full, branch], 3.0))  # never reached
    assert covered([full, branch]) == (3.9, 7.0)
    assert lowest([full, branch], 2.5e9) == 3.9 and lowest([full, branch], 1e9) == 5.0


def test_the_saving_curve_divides_the_envelopes_at_each_loss():
    m0 = [[(1e9, 5.0), (2e9, 4.5), (4e9, 4.0)]]
    m1 = [[(0.5e9, 5.2), (1e9, 4.6), (2e9, 4.0), (3e9, 3.9)]]
    rows = saving_curve(m0, m1, steps=5)
    assert rows[0]["loss"] == pytest.approx(5.0) and rows[-1]["loss"] == pytest.approx(4.0)
    assert rows[-1]["ratio"] == pytest.approx(0.5)
    for r in rows:
        assert r["ratio"] == pytest.approx(reach(m1, r["loss"]) / reach(m0, r["loss"]))
    assert saving_curve(m0, [[(1e9, 3.0)]], steps=5) == []  # no loss both cover


def test_a_runs_kept_branch_state_is_not_taken_for_damaged_weights(tmp_path):
    """A run stopped after its large job kept its branches' states, before their cooldowns read them, leaves
    checkpoint folders (their own manifests, no .sha256 records) in the model's folder: the next run's
    integrity check passes them, and still names a model's weights whose record is gone."""
    from growlm.outputs import damaged_files
    from growlm.errors import sha256

    model = tmp_path / "models" / "baseline" / "d8_L1" / "t100_lr0.1" / "s0"
    for folder in (model, model / "branches" / "b20" / "state", tmp_path / "models" / "other"):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
    (model / "model.safetensors.sha256").write_text(sha256(model / "model.safetensors"))
    assert [p for p, _ in damaged_files(tmp_path)] == [str(tmp_path / "models" / "other" / "model.safetensors")]
