"""The training loop: it learns, resumes bit-exactly, stops on NaN, obeys its schedule."""

import csv
import math
import re

import numpy as np
import pytest
import torch

from conftest import learnable_tokens
from growlm.errors import GrowlmError
from growlm.loss import evaluate
from growlm.model import build_model
from growlm.train import lr_at, train
from growlm.train_config import TrainConfig

V, T = 128, 16


def tokens(n=20000, seed=0):
    return learnable_tokens(V, n, seed)


def tiny_model(seed=0):
    return build_model(seed=seed, n_embd=32, n_layer=2, vocab_size=V, n_positions=T, head_dim=8)


def cfg(**kw):
    base = dict(tokens=8 * T * 40, batch_size=8, context=T, lr=3e-3, warmup_steps=4, eval_interval=10,
                eval_tokens=1024, checkpoint_every=10, dense_log_steps=0, seed=1)
    base.update(kw)
    return TrainConfig(**base)


def test_training_lowers_the_loss(tmp_path):
    data = tokens()
    model = tiny_model()
    before = evaluate(model, data, context=T, max_tokens=2048)["loss"]
    summary = train(model, data, data, cfg(), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "ledger.csv",
                    log=lambda s: None)
    after = evaluate(model, data, context=T, max_tokens=2048)["loss"]
    assert after < before - 0.5, (before, after)
    rows = list(csv.DictReader(open(tmp_path / "ledger.csv")))
    assert [int(r["step"]) for r in rows if r["kind"] == "eval"] == [0, 10, 20, 30, 40]
    flops = [int(r["flops"]) for r in rows]
    assert flops == sorted(flops) and flops[-1] == summary["flops"] > 0
    assert all(float(r["peak_mem_mb"]) > 0 for r in rows)


def test_one_step_lowers_the_loss_on_the_same_batch(tmp_path):
    data = tokens()
    model = tiny_model()
    c = cfg(tokens=8 * T, warmup_steps=0, lr=1e-2)
    from growlm.data import BatchSampler
    from growlm.loss import lm_loss

    x, y = BatchSampler(data, batch_size=8, context=T, seed=c.seed).batch(0)
    before = lm_loss(model, x, y)[0].item()
    train(model, data, data, c, ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "l.csv", log=lambda s: None)
    assert lm_loss(model, x, y)[0].item() < before


LEDGER_MEASUREMENTS = ("wall_s", "peak_mem_mb")  # the machine's, not the run's


def test_resume_is_bitwise_identical(tmp_path):
    data = tokens()
    full = tiny_model()
    train(full, data, data, cfg(), ckpt_dir=tmp_path / "a", ledger_path=tmp_path / "a.csv", log=lambda s: None)

    # an interrupted run: dies after step 25 (last checkpoint: step 20), then is run again
    class Killed(Exception):
        pass

    def kill_at_25(step):
        if step == 25:
            raise Killed

    with pytest.raises(Killed):
        train(tiny_model(), data, data, cfg(), ckpt_dir=tmp_path / "b", ledger_path=tmp_path / "b.csv",
              log=lambda s: None, step_callback=kill_at_25)
    messages, steps_run = [], []
    resumed = tiny_model()  # the job rebuilds the same initial model (the checkpoint must fit its run)
    train(resumed, data, data, cfg(), ckpt_dir=tmp_path / "b", ledger_path=tmp_path / "b.csv", log=messages.append,
          step_callback=steps_run.append)
    assert any("resumed from checkpoint" in m for m in messages)
    assert steps_run[0] == 21 and steps_run[-1] == 40  # only the steps after the checkpoint ran again
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    # the ledger too, in every column but the machine's measurements (the running train loss included)
    a, b = list(csv.DictReader(open(tmp_path / "a.csv"))), list(csv.DictReader(open(tmp_path / "b.csv")))
    assert [{k: v for k, v in r.items() if k not in LEDGER_MEASUREMENTS} for r in a] == \
           [{k: v for k, v in r.items() if k not in LEDGER_MEASUREMENTS} for r in b]


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path):
    data = tokens()
    m = tiny_model()
    train(m, data, data, cfg(tokens=8 * T * 20), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "l.csv",
          log=lambda s: None)
    ckpts = sorted((tmp_path / "ck").glob("step_*"))
    assert [p.name for p in ckpts] == ["step_00000010", "step_00000020"]
    with open(ckpts[-1] / "model.safetensors", "r+b") as fh:
        fh.seek(200)
        fh.write(b"\x00\x01\x02garbage")
    messages = []
    train(tiny_model(), data, data, cfg(tokens=8 * T * 20), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "l.csv",
          log=messages.append)
    assert any("corrupt" in m and "step_00000020" in m for m in messages)
    assert any("resumed from checkpoint step_00000010" in m for m in messages)


def test_nan_loss_stops_with_the_step_named(tmp_path):
    data = tokens()
    model = tiny_model()
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.fill_(float("nan"))
    with pytest.raises(GrowlmError, match=r"loss is nan at step 1; training stopped. No checkpoint was written before "
                                          r"it \(the first comes at step 10\)"):
        train(model, data, data, cfg(), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "l.csv", log=lambda s: None)


def nan_loss_at_call_15(monkeypatch) -> dict:
    """Make the training loss NaN at its 15th call (step 15 with one micro-batch); returns the call count."""
    import growlm.train as train_module

    real, calls = train_module.lm_loss, {"n": 0}

    def nan_at_step_15(model, x, y, **kw):
        calls["n"] += 1
        loss, out = real(model, x, y, **kw)
        return (loss * float("nan") if calls["n"] == 15 else loss), out

    monkeypatch.setattr(train_module, "lm_loss", nan_at_step_15)
    return calls


def test_nan_after_a_checkpoint_says_what_the_checkpoint_is_good_for(tmp_path, monkeypatch):
    nan_loss_at_call_15(monkeypatch)
    with pytest.raises(GrowlmError, match=r"loss is nan at step 15.*checkpoint of step 10 is kept in .*ck, but a rerun "
                                          r"with the same settings resumes there and meets the same loss"):
        train(tiny_model(), tokens(), tokens(), cfg(), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "l.csv",
              log=lambda s: None)


def test_reading_the_losses_every_k_steps_changes_no_number(tmp_path):
    """`sync_every` (how often the losses are read on the host; growlm.train._PendingLosses) is how
    the steps run: with reads every 7 steps and two micro-batches a step, the weights, the dense rows,
    the running average at each evaluation and the checkpoints are those of a read every step."""
    data = tokens()
    runs = {}
    for k in (1, 7):
        model = tiny_model()
        train(model, data, data, cfg(sync_every=k, dense_log_steps=3, micro_batch_size=4), ckpt_dir=tmp_path / f"ck{k}",
              ledger_path=tmp_path / f"l{k}.csv", log=lambda s: None)
        rows = [{c: v for c, v in r.items() if c not in LEDGER_MEASUREMENTS}
                for r in csv.DictReader(open(tmp_path / f"l{k}.csv"))]
        runs[k] = model.state_dict(), rows
    (w1, rows1), (w7, rows7) = runs[1], runs[7]
    assert [int(r["step"]) for r in rows7] == [0, 1, 2, 3, 10, 20, 30, 40]
    assert rows1 == rows7
    assert all(torch.equal(w1[name], w7[name]) for name in w1)
    assert sorted(p.name for p in (tmp_path / "ck7").iterdir()) == sorted(p.name for p in (tmp_path / "ck1").iterdir())


def test_a_nan_read_late_names_its_step_and_no_checkpoint_follows_it(tmp_path, monkeypatch):
    """With reads every 7 steps, a NaN loss at step 15 is seen at the checkpoint of step 20, which is
    then not written: the message names step 15 and the checkpoint of step 10 stays the newest."""
    calls = nan_loss_at_call_15(monkeypatch)
    with pytest.raises(GrowlmError, match=r"loss is nan at step 15; .*checkpoint of step 10 is kept"):
        train(tiny_model(), tokens(), tokens(), cfg(sync_every=7), ckpt_dir=tmp_path / "ck",
              ledger_path=tmp_path / "l.csv", log=lambda s: None)
    assert calls["n"] == 20  # the steps up to the read ran
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["step_00000010"]


def test_a_stop_request_between_reads_checkpoints_after_the_next_step(tmp_path):
    """SIGTERM in a single process is a read of its own: with reads every 7 steps, a signal during
    step 12 still checkpoints after step 13 and exits with status 75, and the resumed run ends with
    the weights of an uninterrupted one."""
    import os
    import signal

    from growlm.train import PREEMPTED_EXIT

    data = tokens()
    full = tiny_model()
    train(full, data, data, cfg(sync_every=7), ckpt_dir=tmp_path / "a", ledger_path=tmp_path / "a.csv",
          log=lambda s: None)

    def term_at_12(step):
        if step == 12:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as stopped:
        train(tiny_model(), data, data, cfg(sync_every=7), ckpt_dir=tmp_path / "b", ledger_path=tmp_path / "b.csv",
              log=lambda s: None, step_callback=term_at_12)
    assert stopped.value.code == PREEMPTED_EXIT
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["step_00000010", "step_00000013"]
    resumed = tiny_model()
    train(resumed, data, data, cfg(sync_every=7), ckpt_dir=tmp_path / "b", ledger_path=tmp_path / "b.csv",
          log=lambda s: None)
    assert all(torch.equal(a, b) for a, b in zip(full.state_dict().values(), resumed.state_dict().values()))


@pytest.mark.parametrize("setting, mode", [(False, None), (True, "default"), ("reduce-overhead", "reduce-overhead")])
def test_train_compile_reaches_torch_compile_as_its_mode(tmp_path, monkeypatch, setting, mode):
    """train.compile: false trains eagerly; true is torch.compile's default mode; a mode name is passed
    on as it is (reduce-overhead: CUDA graphs on a GPU). Compiled only for the training steps."""
    import growlm.train as train_module

    modes = []

    def fake_compile(model, mode=None):
        modes.append(mode)
        return model

    monkeypatch.setattr(train_module.torch, "compile", fake_compile)
    train(tiny_model(), tokens(), tokens(), cfg(tokens=8 * T * 10, compile=setting), ckpt_dir=tmp_path / "ck",
          ledger_path=tmp_path / "l.csv", log=lambda s: None)
    assert modes == ([] if mode is None else [mode])


def test_unknown_compile_mode_and_negative_sync_every_are_named(tmp_path):
    with pytest.raises(GrowlmError, match=r"unknown compile setting 'fast'; true, false or one of \('default', "
                                          r"'reduce-overhead'"):
        cfg(compile="fast").validate()
    with pytest.raises(GrowlmError, match="sync_every must be 0"):
        cfg(sync_every=-1).validate()
    assert cfg(compile=True).compile_mode == "default" and cfg(compile=False).compile_mode is None
    assert cfg(compile="reduce-overhead").compile_mode == "reduce-overhead"
    assert cfg().sync_interval == 1 and cfg(device="cuda").sync_interval == 32 and cfg(sync_every=5).sync_interval == 5


def test_progress_lines_name_the_step_rate_losses_and_time_left(tmp_path, monkeypatch):
    import growlm.train as train_module

    monkeypatch.setattr(train_module, "PROGRESS_EVERY_S", 0.0)  # a line after every step
    lines = []
    train(tiny_model(), tokens(), tokens(), cfg(), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "l.csv",
          log=lines.append)
    steps = [line for line in lines if line.startswith("step ")]
    assert steps[0].startswith("step 0/40 (0%) | val ")
    assert len(steps) == 41 and steps[-1].startswith("step 40/40 (100%)")
    middle = steps[20]
    assert re.match(r"step 20/40 \(50%\) \| [\d,]+ tok/s \| train \d\.\d{4} \| val \d\.\d{4} \(best \d\.\d{4} at step "
                    r"\d+\) \| lr \S+ \| \d+s left$", middle), middle


def test_default_progress_is_every_ten_seconds_and_at_every_evaluation(tmp_path):
    import growlm.train as train_module

    assert train_module.PROGRESS_EVERY_S == 10.0
    lines = []
    train(tiny_model(), tokens(), tokens(), cfg(), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "l.csv",
          log=lines.append)
    assert [int(line.split()[1].split("/")[0]) for line in lines if line.startswith("step ")] == [0, 10, 20, 30, 40]


def test_schedule_warmup_then_cosine():
    c = cfg(tokens=8 * T * 100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, c) == pytest.approx(0.1)
    assert lr_at(9, c) == pytest.approx(1.0)
    assert lr_at(55, c) == pytest.approx(0.55)
    assert lr_at(100, c) == pytest.approx(0.1)
    assert all(lr_at(s, c) >= lr_at(s + 1, c) for s in range(10, 100))


def test_budget_smaller_than_a_batch_is_a_clear_error(tmp_path):
    with pytest.raises(GrowlmError, match="smaller than one batch"):
        train(tiny_model(), tokens(), tokens(), cfg(tokens=10), ckpt_dir=tmp_path, ledger_path=tmp_path / "l.csv")


def test_evaluate_reports_perplexity_and_accuracy():
    m = evaluate(tiny_model(), tokens(), context=T, max_tokens=1024)
    assert m["perplexity"] == pytest.approx(math.exp(m["loss"]))
    assert 0 <= m["accuracy"] <= 1 and m["tokens"] == 1024


def test_checkpoints_of_another_run_are_not_resumed(tmp_path):
    """A job rerun after its settings (or its initial weights) changed must start from the beginning,
    not resume the old run's checkpoint at the same path."""
    data = tokens()
    messages = []
    first = train(tiny_model(), data, data, cfg(), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "a.csv",
                  log=messages.append)
    assert list((tmp_path / "ck").glob("step_*"))  # the finished run left its checkpoints
    # same settings: resumes at the end, nothing to do, same result
    again = train(tiny_model(), data, data, cfg(), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "b.csv",
                  log=messages.append)
    assert again["final_val_loss"] == first["final_val_loss"]
    assert any("resumed from checkpoint" in m for m in messages)
    # another learning rate: a different run
    messages.clear()
    other = train(tiny_model(), data, data, cfg(lr=1e-3), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "c.csv",
                  log=messages.append)
    fresh = train(tiny_model(), data, data, cfg(lr=1e-3), ckpt_dir=tmp_path / "ck2", ledger_path=tmp_path / "d.csv",
                  log=lambda *_: None)
    assert any("belong to another run" in m for m in messages)
    assert not any("resumed from checkpoint" in m for m in messages)
    assert other["final_val_loss"] == fresh["final_val_loss"]
    # other initial weights (e.g. the grow job reran with other options): a different run too
    messages.clear()
    train(tiny_model(seed=5), data, data, cfg(lr=1e-3), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "e.csv",
          log=messages.append)
    assert any("belong to another run" in m for m in messages)


def _correlated_windows(rng, k, lengths, *, window_sd=0.3, rho=0.8, token_sd=1.0):
    """Synthetic per-token losses of `k` windows, correlated within a window as real text's are: a window's
    own level (its passage's difficulty, sd `window_sd`) plus AR(1) token noise (correlation `rho` between
    neighbours, sd `token_sd`). Returns each window's summed loss and its token count."""
    counts = np.asarray(lengths, dtype=float)
    noise = np.empty((k, int(counts.max())))
    noise[:, 0] = rng.normal(0, token_sd, k)
    for j in range(1, noise.shape[1]):  # AR(1) along each window, all windows at once
        noise[:, j] = rho * noise[:, j - 1] + math.sqrt(1 - rho ** 2) * rng.normal(0, token_sd, k)
    inside = np.arange(noise.shape[1])[None, :] < counts[:, None]
    sums = ((3.0 + rng.normal(0, window_sd, k))[:, None] + noise) * inside
    return sums.sum(1), counts


@pytest.mark.parametrize("equal", [True, False])
def test_the_standard_error_is_a_block_bootstrap_s_and_the_sampling_spread_s(equal):
    """`mean_and_se` (windows as blocks) on correlated synthetic windows, of equal or unequal lengths: it
    agrees with a bootstrap that resamples whole windows (2,000 draws) within 10%, and with the real spread
    of the mean over 300 fresh draws of the data within 15%; the naive per-token SE (tokens taken as
    independent) is several times too small here, so the test tells the two apart."""
    from growlm.loss import mean_and_se

    rng = np.random.default_rng(7)
    k = 200
    lengths = [32] * k if equal else list(rng.integers(8, 64, k))
    sums, counts = _correlated_windows(rng, k, lengths)
    mean, se = mean_and_se(sums, counts)
    assert mean == pytest.approx(sums.sum() / counts.sum(), rel=1e-12)
    picks = rng.integers(0, k, size=(2000, k))
    boot = sums[picks].sum(1) / counts[picks].sum(1)
    assert se == pytest.approx(boot.std(ddof=1), rel=0.10), (se, boot.std(ddof=1))
    means = []
    for _ in range(300):
        s, n = _correlated_windows(rng, k, lengths)
        means.append(s.sum() / n.sum())
    assert se == pytest.approx(np.std(means, ddof=1), rel=0.15), (se, np.std(means, ddof=1))
    # the naive SE, the per-token spread over sqrt(tokens), is about a third of the truth for these windows
    token_sd = math.sqrt(1.0 + 0.3 ** 2)
    assert token_sd / math.sqrt(counts.sum()) < se / 2.5
    if equal:  # equal windows: the per-window means' sample spread over sqrt(windows), exactly
        assert se == pytest.approx(np.std(sums / 32, ddof=1) / math.sqrt(k), rel=1e-12)


def test_mean_and_se_refuses_what_has_no_answer():
    from growlm.loss import mean_and_se

    assert math.isnan(mean_and_se([6.0], [2])[1]) and mean_and_se([6.0], [2])[0] == 3.0  # one window: no spread
    with pytest.raises(GrowlmError, match="one count per window sum"):
        mean_and_se([1.0, 2.0], [3])
    with pytest.raises(GrowlmError, match="must be positive"):
        mean_and_se([1.0, 2.0], [3, 0])
    with pytest.raises(GrowlmError, match="block must be a number of windows"):
        mean_and_se([1.0, 2.0], [3, 3], block=0)


def test_blocks_of_consecutive_windows_are_their_sums():
    """`block=b` takes b consecutive windows as one block (the last one shorter): the same as summing them first."""
    from growlm.loss import mean_and_se

    rng = np.random.default_rng(3)
    sums, counts = rng.normal(50, 5, 23), rng.integers(10, 20, 23).astype(float)
    blocked = [(sums[i:i + 4].sum(), counts[i:i + 4].sum()) for i in range(0, 23, 4)]
    expect = mean_and_se([b[0] for b in blocked], [b[1] for b in blocked])
    assert mean_and_se(sums, counts, block=4) == pytest.approx(expect, rel=1e-12)
    assert mean_and_se(sums, counts, block=1) == mean_and_se(sums, counts)
    assert math.isnan(mean_and_se(sums, counts, block=23)[1])


def _window_losses(model, data, n_win):
    """Each window's summed next-token loss, one window at a time (not the evaluation's batches)."""
    out = []
    with torch.no_grad():
        for i in range(n_win):
            w = torch.from_numpy(data[i * T:(i + 1) * T + 1].astype(np.int64))[None]
            logits = model(input_ids=w[:, :-1]).logits.float()
            out.append(torch.nn.functional.cross_entropy(logits[0], w[0, 1:], reduction="sum").item())
    return np.array(out)


@pytest.mark.parametrize("final", [0, 3000])
def test_the_last_evaluation_reads_the_final_tokens_with_its_standard_error(tmp_path, final):
    """Every evaluation reads eval_tokens (1,024: 64 windows of 16) and records its standard error and the
    tokens it read; the last reads final_eval_tokens (0: every whole window of the 5,000-token split, 312;
    3,000: 187 windows): its loss and SE are those of the trained model's windows read one at a time, its
    val_loss_curve the loss an ordinary evaluation gives, and its seconds are not training time."""
    from growlm.loss import mean_and_se

    data, val = tokens(), tokens(5000, seed=1)
    model = tiny_model()
    summary = train(model, data, val, cfg(final_eval_tokens=final), ckpt_dir=tmp_path / "ck",
                    ledger_path=tmp_path / "l.csv", log=lambda s: None)
    rows = [r for r in csv.DictReader(open(tmp_path / "l.csv")) if r["kind"] == "eval"]
    n_win = 312 if final == 0 else 187
    assert [int(r["val_tokens"]) for r in rows] == [1024] * 4 + [n_win * T]
    assert all(r["val_loss"] == r["val_loss_curve"] for r in rows[:-1])
    model.eval()
    sums = _window_losses(model, val, n_win)
    mean, se = mean_and_se(sums, np.full(n_win, T))
    last = rows[-1]
    assert float(last["val_loss"]) == pytest.approx(mean, abs=1e-5)
    assert float(last["val_loss_se"]) == pytest.approx(se, rel=1e-3)
    # each window's loss, kept beside the ledger for comparing two runs on the same windows
    assert np.load(tmp_path / "l.val_windows.npy") == pytest.approx(sums / T, rel=1e-5)
    assert float(last["val_loss_curve"]) == round(evaluate(model, val, context=T, batch_size=8, max_tokens=1024)["loss"], 5)
    # fewer windows, a larger error: the first evaluations' SE against the last's, about sqrt(n_win / 64)
    assert float(rows[-2]["val_loss_se"]) > 1.5 * float(last["val_loss_se"])
    assert summary["final_val_loss_se"] == float(last["val_loss_se"]) and summary["final_val_tokens"] == n_win * T
    assert summary["final_eval_s"] > 0 and summary["wall_s"] == pytest.approx(float(last["wall_s"]), abs=0.5)


def test_window_losses_compare_two_models_on_the_same_windows(tmp_path):
    """`window_losses` reads the windows a run's last evaluation reads, each window's sum as one window read alone
    gives it; a model against itself differs by exactly 0 with no error, and two close models (one slightly
    perturbed) differ with a paired standard error far under either loss's own (what the windows share cancels)."""
    from growlm.loss import mean_and_se, window_losses

    val = tokens(5000, seed=1)
    a = tiny_model()  # trained, so that windows differ in difficulty (the noise tokens in them), as in real text
    train(a, tokens(), val, cfg(), ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "l.csv", log=lambda s: None)
    a.eval()
    b = tiny_model().eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        for p in b.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.003)
    sa, sb = window_losses(a, val, context=T, batch_size=8), window_losses(b, val, context=T, batch_size=8)
    n_win = 312  # every whole window of the 5,000-token split
    assert sa.shape == (n_win,) and sa.dtype == np.float64
    assert sa == pytest.approx(_window_losses(a, val, n_win), rel=1e-5)
    counts = np.full(n_win, T)
    assert mean_and_se(sa - sa, counts) == (0.0, 0.0)
    diff, paired_se = mean_and_se(sb - sa, counts)
    assert diff == pytest.approx(mean_and_se(sb, counts)[0] - mean_and_se(sa, counts)[0], abs=1e-12)
    assert 0 < paired_se < 0.2 * min(mean_and_se(sa, counts)[1], mean_and_se(sb, counts)[1])
    assert window_losses(a, val, context=T, batch_size=8, max_tokens=1024).shape == (64,)


def test_a_negative_final_eval_tokens_is_named():
    with pytest.raises(GrowlmError, match="final_eval_tokens must be 0 .the whole validation split. or a number"):
        cfg(final_eval_tokens=-1).validate()


def test_a_last_evaluation_like_the_others_keeps_the_settings_of_before():
    """final_eval_tokens equal to eval_tokens is what growlm computed before there was the key: the run's
    settings (a rule's params, the checkpoint's identity) leave it out, as they were, and read back the same;
    any other value is in them."""
    same = cfg(final_eval_tokens=1024)
    assert "final_eval_tokens" not in same.run_settings()
    assert TrainConfig.from_dict(same.run_settings()) == same.with_(inputs=None)
    assert cfg().run_settings()["final_eval_tokens"] == 0
    assert TrainConfig.from_dict(cfg().run_settings()).final_eval_tokens == 0
