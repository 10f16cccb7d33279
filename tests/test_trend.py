"""The multiplier's trend over sizes (growlm.trend) and its inputs and command (growlm.predict): the fit recovers a
known slope, its prediction interval holds a new size's measurement about 95% of the time, one size is refused, the
extrapolation is labelled, and the command reads curves.csv files made anywhere."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from growlm.errors import GrowlmError
from growlm.predict import comparison_from_curves, main, nonembedding_params, points_from_comparison
from growlm.trend import fit_trend, times

SIZES = (0.34e6, 1.1e6, 3.7e6)
A, B, SD = 0.05, 0.1, 0.05  # log m = A + B log(N / 1M), seeds spread SD in log m


def true_log_m(n):
    return A + B * np.log(np.asarray(n) / 1e6)


def ladder(rng, sizes=SIZES, seeds=3):
    return pd.DataFrame([{"params": n, "seed": s, "multiplier": math.exp(true_log_m(n) + rng.normal(0, SD))}
                         for n in sizes for s in range(seeds)])


def test_the_fit_recovers_a_known_slope():
    """Noise-free, the line is the truth exactly; with the seeds' noise the slope is near it and inside its interval."""
    exact = pd.DataFrame([{"params": n, "seed": s, "multiplier": math.exp(true_log_m(n) + d)}
                          for n in SIZES for s, d in enumerate((-0.01, 0.0, 0.01))])
    t = fit_trend(exact)
    assert t.ok and t.slope == pytest.approx(B, abs=1e-12) and t.intercept == pytest.approx(A - B * math.log(1e6))
    assert t.multiplier_at(2e6) == pytest.approx(math.exp(true_log_m(2e6)), rel=1e-12)
    noisy = fit_trend(ladder(np.random.default_rng(1), seeds=5))
    assert abs(noisy.slope - B) < 0.03 and noisy.slope_low < B < noisy.slope_high
    assert noisy.slope_low < noisy.slope < noisy.slope_high


def test_the_prediction_interval_covers_a_new_size_about_95_percent_of_the_time():
    """200 seeded ladders of 3 sizes x 3 seeds; the truth a new size ten times past the largest would measure (the
    mean of its 3 seeds' log m). Measured 0.97 (the module docstring: the scale factor's price); the band 0.92-0.99
    is about 2.5 binomial standard deviations either side of 0.95 and 0.97. The line's interval holds the true
    line alike."""
    star = 10 * SIZES[-1]
    held = line = 0
    for r in range(200):
        rng = np.random.default_rng(r)
        p = fit_trend(ladder(rng), n_boot=500, seed=r).predict(star, seeds=3)
        measured = math.exp(true_log_m(star) + rng.normal(0, SD, 3).mean())
        held += p.low <= measured <= p.high
        line += p.line_low <= math.exp(true_log_m(star)) <= p.line_high
        assert p.line_low <= p.multiplier <= p.line_high and p.low <= p.line_low and p.line_high <= p.high
    assert 0.92 <= held / 200 <= 0.99, held
    assert 0.92 <= line / 200 <= 0.99, line


def test_one_size_is_refused_and_a_prediction_from_it_is_a_clear_error():
    t = fit_trend(ladder(np.random.default_rng(0), sizes=(1e6,)))
    assert not t.ok and "1 size(s) measured (a trend needs 2)" in t.why
    with pytest.raises(GrowlmError, match="no trend to predict from: 1 size"):
        t.predict(1e8)
    one_seed = fit_trend(ladder(np.random.default_rng(0), seeds=1))
    assert not one_seed.ok and "one seed per size" in one_seed.why


def test_the_prediction_says_how_far_past_the_largest_size_it_reaches():
    t = fit_trend(ladder(np.random.default_rng(2)))
    far = t.predict(124e6, seeds=3)
    assert far.extrapolated and far.reach == pytest.approx(124e6 / 3.7e6)
    assert far.label == "an extrapolation 33.5 times past the largest measured size (3.7M non-embedding parameters)"
    inside = t.predict(2e6)
    assert not inside.extrapolated and inside.label.startswith("an interpolation between the measured sizes (340k-3.7M)")
    assert "below the smallest measured size" in t.predict(1e5).label
    # further out, a wider interval of the line (in log)
    near = t.predict(5e6, seeds=3)
    assert math.log(far.line_high / far.line_low) > math.log(near.line_high / near.line_low)
    with pytest.raises(GrowlmError, match="params -1"):
        t.predict(-1)


# ------------------------------------------------------------------------------------------------------------------
# curves.csv files made elsewhere
# ------------------------------------------------------------------------------------------------------------------

E0, A0, ALPHA = 2.5, 40.0, 0.3  # M_0's loss against its FLOPs in units of 1e12


def m0_loss(c):
    return E0 + A0 * (c / 1e12) ** -ALPHA


def m0_compute(loss):
    return 1e12 * ((loss - E0) / A0) ** (-1 / ALPHA)


def synthetic_curves(d1s=(32, 64), seeds=3, tpp=8.0, m_of=lambda n: 1.2, rng=None) -> pd.DataFrame:
    """curves.csv rows of a ladder: per size and seed, M_0's full run and 4 cooldown branches (their ends on M_0's
    curve, a seed offset of 0.002), M_1 ("msg") ending where M_0's curve needs `m_of(N)` times M_1's total FLOPs,
    its one member's curve (half of M_1's offset) before it."""
    rng = rng or np.random.default_rng(0)
    rows = []
    for d1 in d1s:
        n = nonembedding_params(d1, 2)
        budget = int(tpp * n)
        flops = 6.0 * n * budget  # M_0's run of the budget
        keys = {"d0": d1 // 2, "L0": 1, "d1": d1, "L1": 2, "n": 1, "method": "msg", "budget": budget}
        for seed in range(seeds):
            off = rng.normal(0, 0.002)
            for run, share in (("branch 0.2", 0.25), ("branch 0.35", 0.4), ("branch 0.5", 0.55), ("branch 0.7", 0.75),
                               ("full", 1.0)):
                for step, part in ((1, 0.5), (2, 1.0)):
                    rows.append({**keys, "seed": seed, "arm": "M_0 (scratch)", "run": run, "step": step,
                                 "flops": share * part * flops, "offset_flops": 0.0,
                                 "val_loss": m0_loss(share * part * flops) + off, "is_end": part == 1.0})
            offset, refine = 0.1 * flops, 0.9 * flops
            loss = m0_loss(m_of(n) * (offset + refine)) + rng.normal(0, 0.001)
            rows += [{**keys, "seed": seed, "arm": "M_1 (msg)", "run": "full", "step": 1, "flops": refine / 2,
                      "offset_flops": offset, "val_loss": loss + 0.2, "is_end": False},
                     {**keys, "seed": seed, "arm": "M_1 (msg)", "run": "full", "step": 2, "flops": refine,
                      "offset_flops": offset, "val_loss": loss, "is_end": True},
                     {**keys, "seed": seed, "arm": "m_1 (small, level 0)", "run": "full", "step": 2,
                      "flops": offset / 2, "offset_flops": 0.0, "val_loss": 4.0, "is_end": True}]
    df = pd.DataFrame(rows)
    df["total_flops"] = df["flops"] + df["offset_flops"]
    return df


def test_curves_give_each_seed_its_multiplier_as_the_comparison_computes_it():
    """Recomputed from the curves' run ends: each seed's multiplier is M_0's fitted curve's FLOPs for its final loss
    over its total FLOPs (members counted), and over its FLOPs less the member's (free); tokens per parameter from
    d1 and L1."""
    curves = synthetic_curves(d1s=(32,), rng=np.random.default_rng(3))
    table = comparison_from_curves(curves, n_boot=100)
    assert len(table) == 3 and table["tokens_per_param"].round(9).eq(8.0).all()
    assert table["seed_multiplier"].to_numpy() == pytest.approx(1.2, rel=0.05)
    ends = curves[(curves["arm"] == "M_1 (msg)") & curves["is_end"]]
    ratio = (ends["total_flops"] / (ends["total_flops"] - 0.05 * ends["total_flops"] / 1.0)).to_numpy()
    # free: the member's FLOPs (half the offset, 0.05 of M_0's) left out of what M_1 spent
    assert (table["seed_multiplier_free"] / table["seed_multiplier"]).to_numpy() == pytest.approx(ratio, rel=1e-9)
    points = points_from_comparison(table)
    assert points["params"].to_numpy() == pytest.approx(nonembedding_params(32, 2))


def test_the_command_prints_the_trend_and_the_prediction_from_curves_files(tmp_path, capsys):
    """Two curves.csv files (one per size, as two experiments would write them): the trend of a multiplier that grows
    as N^0.2 recovers the slope, and the prediction is labelled with its reach."""
    rng = np.random.default_rng(5)
    for d1 in (32, 96):
        synthetic_curves(d1s=(d1,), m_of=lambda n: 1.2 * (n / 1e5) ** 0.2, rng=rng).to_csv(tmp_path / f"{d1}.csv",
                                                                                            index=False)
    out_csv = tmp_path / "trend.csv"
    rc = main([str(tmp_path / "32.csv"), str(tmp_path / "96.csv"), "--params", "124e6", "--tokens-per-param", "20",
               "--n-boot", "200", "--csv", str(out_csv)])
    text = capsys.readouterr().out
    assert rc == 0, text
    table = pd.read_csv(out_csv)
    counted = table[table["measure"] == "counted"].iloc[0]
    assert counted["slope"] == pytest.approx(0.2, abs=0.02)
    assert counted["reach"] == pytest.approx(124e6 / nonembedding_params(96, 2))
    assert "msg (n = 1), 8 tokens per parameter, members counted: log m = a + 0.2" in text
    assert "(no size was measured at 20 tokens per parameter: the trend at 8)" in text
    assert f"an extrapolation {times(124e6 / nonembedding_params(96, 2))} times past the largest measured size" in text
    assert "two sizes: no check of the line" in text


def test_the_command_names_a_bad_file_in_one_line_and_refuses_unknown_arguments(tmp_path, capsys):
    good = tmp_path / "good.csv"
    synthetic_curves(d1s=(32,)).to_csv(good, index=False)
    (tmp_path / "bad.csv").write_text("step,val_loss\n1,2\n")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00garbage\x00")
    cases = {"missing.csv": "missing.csv: no such file", "bad.csv": "bad.csv: not a curves.csv of growlm's (it lacks "
             "column(s) d0, L0, d1, L1, n, method, seed, budget, arm, run, flops, offset_flops, is_end)",
             "binary.csv": "binary.csv: not a readable CSV"}
    for name, line in cases.items():
        assert main([str(good), str(tmp_path / name)]) == 1
        err = capsys.readouterr().err
        assert line in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as exit_:
        main([str(good), "--size", "3"])
    assert exit_.value.code == 2 and "unrecognized arguments: --size 3" in capsys.readouterr().err
    assert main([str(good), "--params", "1e8"]) == 2
    assert "--params and --tokens-per-param go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(good), "--params", "-5", "--tokens-per-param", "20"])
    assert "'-5' is not a positive number" in capsys.readouterr().err
    # one size: the trend is refused, said in a line, not a traceback
    assert main([str(good), "--n-boot", "50"]) == 0
    assert "msg (n = 1), 8 tokens per parameter, members counted: no trend (1 size(s) measured (a trend needs 2))" \
        in capsys.readouterr().out
    # the bench script is the same command
    run = subprocess.run([sys.executable, str(REPO / "bench" / "predict.py"), "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "--tokens-per-param" in run.stdout and "curves.csv" in run.stdout


# ------------------------------------------------------------------------------------------------------------------
# the report's first page and the config's `predict`
# ------------------------------------------------------------------------------------------------------------------

def two_size_comparison(path, rng):
    """comparison.csv rows of msg at d1 = 32 and 64 (8 tokens per parameter), 3 seeds each, with each seed's
    multipliers, as growlm.compare writes them."""
    rows = []
    for d1, m in ((32, 1.1), (64, 1.3)):
        n = nonembedding_params(d1, 2)
        for seed in range(3):
            value = m * math.exp(rng.normal(0, 0.03))
            rows.append({"d0": d1 // 2, "L0": 1, "d1": d1, "L1": 2, "n": 1, "method": "msg", "seed": seed,
                         "budget": int(8 * n), "arm": "grown from n members", "members_used": 1, "reached": True,
                         "m0_final_val_loss": 4.0, "m1_final_val_loss": 3.95, "cost_ratio": 0.9,
                         "cost_ratio_small_free": 0.85, "members_cost": "counted", "tokens_per_param": 8.0,
                         "tokens_per_param_total": 4.0, "multiplier": m, "multiplier_low": m - 0.1,
                         "multiplier_high": m + 0.1, "multiplier_free": m + 0.1, "multiplier_free_low": m,
                         "multiplier_free_high": m + 0.2, "saving": "saving", "m1_seeds": 3, "extrapolated": False,
                         "extrapolation_factor": 1.0, "seed_multiplier": value, "seed_multiplier_free": value * 1.1})
    pd.DataFrame(rows).to_csv(path, index=False)
    return pd.DataFrame(rows)


def test_the_first_page_gives_the_trend_and_its_prediction_with_two_sizes(tmp_path):
    """A two-size comparison: the first page gains the trend's figure (the measured points, the band, the prediction)
    and a sentence with the prediction at the configured size, labelled as an extrapolation with its interval and its
    reach; one size, or no `predict`, says no prediction."""
    from growlm.report.figures import trend_plot
    from growlm.report.summary import trend_sentences, write_summary

    df = two_size_comparison(tmp_path / "c.csv", np.random.default_rng(0))
    predict = {"params": 124e6, "tokens_per_param": 20}
    assert trend_plot(tmp_path / "c.csv", tmp_path / "trend.svg", predict)
    svg = (tmp_path / "trend.svg").read_text()
    assert "8 tokens per non-embedding parameter" in svg and "prediction at 1.24e+08 parameters" in svg
    (tmp_path / "d.rst").write_text("The workflow.\n")
    write_summary(tmp_path / "c.csv", tmp_path / "d.rst", tmp_path / "s.rst", trend_svg=tmp_path / "trend.svg",
                  predict=predict)
    page = (tmp_path / "s.rst").read_text()
    assert 'id="growlm-trend"' in page
    points = points_from_comparison(df)
    t = fit_trend(points)
    p = t.predict(124e6)
    largest = nonembedding_params(64, 2)
    want = (f"At 124M non-embedding parameters and 20 tokens per parameter (no size was measured at 20 tokens per "
            f"parameter: the trend at 8) it predicts a multiplier of {p.multiplier:.2f} (95% prediction interval "
            f"{p.low:.2f}-{p.high:.2f} for a measurement over 3 seeds; the trend itself {p.line_low:.2f}-"
            f"{p.line_high:.2f}): an extrapolation {times(124e6 / largest)} times past the largest measured size "
            f"({largest / 1e3:.3g}k non-embedding parameters)")
    assert want in page, page
    assert "**msg** (n = 1, members counted): " in page and f"goes as N^{t.slope:.2f}" in page
    assert "with two sizes nothing checks that the trend is a straight line" in page
    # without predict: the trend, no prediction
    assert not any("predicts" in s for s in trend_sentences(df)) and trend_sentences(df)
    # one size: no trend, no figure
    one = df[df["d1"] == 32]
    one.to_csv(tmp_path / "one.csv", index=False)
    assert trend_sentences(one, predict) == []
    assert not trend_plot(tmp_path / "one.csv", tmp_path / "none.svg", predict)
    assert (tmp_path / "none.svg").read_text() == ""


def test_a_config_with_predict_plans_and_a_bad_value_is_refused_in_one_line(tmp_path):
    from conftest import TINY, copy_workflow, plan

    wd = copy_workflow(tmp_path / "wf")
    (wd / "ok.yaml").write_text("predict: {params: 124e6, tokens_per_param: 20}\n")
    error, jobs = plan(wd, configfiles=(TINY, "ok.yaml"))
    assert error is None and any(rule == "report_figures" for rule, _ in jobs), error
    cases = {"predict: {params: -1, tokens_per_param: 20}": "predict.params = -1",
             "predict: {params: 1e8}": "'tokens_per_param' is a required property",
             "predict: {params: 1e8, tokens_per_param: 20, seeds: 3}": "predict.seeds: unknown key"}
    for i, (overlay, line) in enumerate(cases.items()):
        (wd / f"c{i}.yaml").write_text(overlay + "\n")
        error, _ = plan(wd, configfiles=(TINY, f"c{i}.yaml"))
        assert error is not None and line in error and "\n" not in error.strip(), error
