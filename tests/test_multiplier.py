"""The effective compute multiplier (growlm.multiplier) and the envelope of finished runs
(growlm.envelope.finished_reach): the fit recovers known curves, the interval covers the true multiplier about
as often as it says, an extrapolation is flagged by its factor, a refused fit gives NaN, not a number."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from growlm.envelope import finished_reach
from growlm.errors import GrowlmError
from growlm.multiplier import Fit, arm_multiplier, fit_power_law, seed_multipliers

U = 1e15  # FLOPs of M_0's budget: the synthetic curves are written in units of it
FRACTIONS = (0.2, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0)  # M_0's finished runs: branch ends, its end, an extension


def curve(E, A_unit, alpha):
    """L(C) = E + A_unit (C / U)^-alpha, i.e. A = A_unit U^alpha in FLOPs' own units."""
    return lambda C: E + A_unit * (np.asarray(C, dtype=float) / U) ** -alpha


def experiment(rng, L, *, m=1.1, k0=3, k1=3, sd_seed=0.01, sd_eval=0.004, c1=0.8 * U, free=0.6):
    """M_0's finished runs at FRACTIONS of U for k0 seeds, each seed's curve shifted by its own offset (the
    seed-to-seed spread, shared by a seed's branches) plus each evaluation's noise; M_1's k1 final losses at
    c1 FLOPs (members counted; `free` times that with them free), drawn around L(m c1): the true multiplier
    is m (and m / free with the members free)."""
    rows = [(s, f * U, L(f * U) + off + rng.normal(0, sd_eval))
            for s in range(k0) for off in [rng.normal(0, sd_seed)] for f in FRACTIONS]
    m0 = pd.DataFrame(rows, columns=["seed", "flops", "loss"])
    loss = L(m * c1) + rng.normal(0, sd_seed, k1) + rng.normal(0, sd_eval, k1)
    m1 = pd.DataFrame({"seed": range(k1), "flops": c1, "flops_free": free * c1, "loss": loss})
    return m0, m1


# (E, A at the budget, alpha) and the tolerances (relative E, relative alpha, relative A at the budget) the
# fit meets from 36 points over 2.3 decades with 0.2% noise: about twice the worst error measured over 20
# noise draws of each (the last curve, small E under a slow power, is the hardest to separate)
CURVES = [((3.0, 0.8, 0.35), (0.02, 0.03, 0.06)), ((2.0, 5.0, 0.3), (0.12, 0.03, 0.05)),
          ((4.5, 1.5, 0.6), (0.015, 0.015, 0.03)), ((1.0, 2.0, 0.15), (0.2, 0.08, 0.1))]


@pytest.mark.parametrize("params,tol", CURVES)
def test_the_fit_recovers_known_curves(params, tol):
    E, A_unit, alpha = params
    L = curve(*params)
    C = np.repeat(U * np.logspace(-2, 0.3, 12), 3)
    exact = fit_power_law(C, L(C))  # no noise: the curve itself, to the optimiser's precision
    assert exact.ok and exact.n == 36 and exact.why == ""
    assert exact.E == pytest.approx(E, rel=1e-5) and exact.alpha == pytest.approx(alpha, rel=1e-5)
    assert exact.A == pytest.approx(A_unit * U ** alpha, rel=1e-4)
    rng = np.random.default_rng(7)
    for _ in range(5):
        fit = fit_power_law(C, L(C) * np.exp(rng.normal(0, 0.002, C.size)))
        assert fit.ok
        assert abs(fit.E / E - 1) < tol[0] and abs(fit.alpha / alpha - 1) < tol[1]
        assert abs(fit.A * U ** -fit.alpha / A_unit - 1) < tol[2]
        assert np.max(np.abs(fit.loss_at(C) / L(C) - 1)) < 0.005


def test_compute_for_inverts_the_curve():
    fit = Fit(E=3.0, A=0.8 * U ** 0.35, alpha=0.35, n=7, ok=True)
    for C in (0.01 * U, U, 30 * U):
        assert fit.compute_for(fit.loss_at(C)) == pytest.approx(C, rel=1e-9)
    assert fit.compute_for(3.0) == math.inf and fit.compute_for(2.5) == math.inf  # the curve never gets there
    assert math.isnan(fit.compute_for(math.nan))
    refused = Fit(n=2, why="2 distinct compute values")
    assert math.isnan(refused.compute_for(3.5)) and math.isnan(refused.loss_at(U))
    assert np.isnan(refused.loss_at(np.array([U, 2 * U]))).all()


def test_a_fit_without_enough_or_finite_points_is_refused():
    L = curve(3.0, 0.8, 0.35)
    two = np.array([U, U, 2 * U, 2 * U])
    fit = fit_power_law(two, L(two))
    assert not fit.ok and "2 distinct compute values" in fit.why and math.isnan(fit.E)
    C = U * np.array([0.2, 0.5, 1.0, 2.0])
    loss = L(C)
    loss[1] = np.nan
    assert not fit_power_law(C, loss).ok and "non-finite" in fit_power_law(C, loss).why
    assert "positive" in fit_power_law(C * np.array([0, 1, 1, 1]), L(C)).why
    # the multiplier says NaN and states no saving
    m0 = pd.DataFrame({"seed": [0, 0, 1, 1], "flops": two, "loss": L(two)})
    m1 = pd.DataFrame({"seed": [0, 1], "flops": [U, U], "flops_free": [U, U], "loss": [3.8, 3.81]})
    out = arm_multiplier(m0, m1, n_boot=50)
    assert math.isnan(out["multiplier"]) and math.isnan(out["multiplier_low"]) and math.isnan(out["multiplier_free"])
    assert out["saving"] == "" and "refused" in out["interval_method"] and out["extrapolated"] is False


def test_the_multiplier_of_noiseless_curves_is_exact_and_flags_extrapolation():
    L = curve(3.0, 0.8, 0.35)
    m0 = pd.DataFrame([(s, f * U, float(L(f * U))) for s in range(3) for f in FRACTIONS[:5]],
                      columns=["seed", "flops", "loss"])  # finished runs from 0.2 U to U
    c1 = 0.5 * U

    def arm(m):
        m1 = pd.DataFrame({"seed": [0, 1, 2], "flops": c1, "flops_free": 0.25 * U, "loss": float(L(m * c1))})
        return m1, arm_multiplier(m0, m1, n_boot=50)

    m1, inside = arm(1.6)  # M_0 needs 0.8 U for M_1's loss: inside its finished runs
    assert inside["multiplier"] == pytest.approx(1.6, rel=1e-5)
    assert inside["multiplier_free"] == pytest.approx(1.6 * c1 / (0.25 * U), rel=1e-5)
    assert inside["extrapolated"] is False and inside["extrapolation_factor"] == 1.0
    assert inside["m0_fit_E"] == pytest.approx(3.0, rel=1e-5) and inside["m0_fit_alpha"] == pytest.approx(0.35, rel=1e-5)
    assert (inside["m0_points"], inside["m0_seeds"], inside["m1_seeds"]) == (15, 3, 3)
    assert inside["multiplier_low"] == pytest.approx(1.6, rel=1e-4) == inside["multiplier_high"]  # no spread
    # the evaluation's error, shared by the seeds, carried through the curve's slope at M_1's loss: with no spread
    # over seeds the interval is exactly log m +- t_{windows - 1} eval_se / (alpha (L_1 - E))
    evaluated = arm_multiplier(m0, m1, n_boot=50, eval_se=0.01, eval_windows=200)
    half = stats.t.ppf(0.975, 199) * 0.01 / (0.35 * (float(m1["loss"].iloc[0]) - 3.0))
    assert math.log(evaluated["multiplier_high"] / 1.6) == pytest.approx(half, rel=1e-3)
    assert math.log(1.6 / evaluated["multiplier_low"]) == pytest.approx(half, rel=1e-3)
    assert evaluated["multiplier"] == inside["multiplier"] and evaluated["eval_se"] == 0.01
    assert "the evaluation's SE 0.0100 over 200 windows, df 199.0" in evaluated["interval_method"]
    # with spread over seeds, the evaluation's error only widens the interval (its windows do not raise the df)
    noisy = m1.assign(loss=m1["loss"] + np.array([-0.01, 0.0, 0.012]))
    seeds_only = arm_multiplier(m0, noisy, n_boot=200)
    both = arm_multiplier(m0, noisy, n_boot=200, eval_se=0.001, eval_windows=200)
    assert both["multiplier_low"] < seeds_only["multiplier_low"] and both["multiplier_high"] > seeds_only["multiplier_high"]
    assert seeds_only["interval_method"].split("df ")[1] == both["interval_method"].split("df ")[1]
    with pytest.raises(GrowlmError, match="eval_se needs the number of windows"):
        arm_multiplier(m0, m1, n_boot=50, eval_se=0.01)
    with pytest.raises(GrowlmError, match="must be a standard error"):
        arm_multiplier(m0, m1, n_boot=50, eval_se=-0.01, eval_windows=200)
    per_seed = seed_multipliers(fit_power_law(m0["flops"], m0["loss"]), m1)
    assert list(per_seed.columns) == ["seed", "loss", "flops", "flops_free", "m0_flops", "multiplier", "multiplier_free"]
    assert np.allclose(per_seed["multiplier"], 1.6, rtol=1e-5) and np.allclose(per_seed["m0_flops"], 0.8 * U, rtol=1e-5)

    _, beyond = arm(6.0)  # M_1 ends below M_0's lowest finished run: the curve read at 3 U, 3x past its largest
    assert beyond["extrapolated"] is True and beyond["extrapolation_factor"] == pytest.approx(3.0, rel=1e-5)
    assert beyond["multiplier"] == pytest.approx(6.0, rel=1e-5)
    _, before = arm(0.1)  # above M_0's first finished run: read at 0.05 U, 4x before its smallest (0.2 U)
    assert before["extrapolated"] is True and before["extrapolation_factor"] == pytest.approx(4.0, rel=1e-5)
    m1 = pd.DataFrame({"seed": [0], "flops": c1, "flops_free": c1, "loss": 2.9})  # below E: no compute gets there
    below_e = arm_multiplier(m0, m1, n_boot=50)
    assert below_e["multiplier"] == math.inf and below_e["extrapolation_factor"] == math.inf
    assert below_e["extrapolated"] is True and below_e["saving"] == ""


def test_the_interval_covers_the_true_multiplier_about_95_percent_of_the_time():
    """200 synthetic experiments of 3 seeds a side (M_0 with a seed offset of 0.01 in loss and evaluation
    noise of 0.004, M_1's final loss drawn the same way around the loss M_0's curve has at 1.1 times M_1's
    FLOPs): the 95% interval must hold the true multiplier, 1.1 (and 1.1 / 0.6 with the members free), in
    0.90-0.99 of them (binomial 95% range of a 0.95 coverage over 200 draws: 0.92-0.98). 200 bootstrap draws
    per experiment, not the default 2000, keep the test to seconds: they estimate a standard error, which 200
    draws give to about 5%, and 3 seeds have only 10 distinct resamples to refit. A percentile bootstrap on
    the same experiments covers about 0.8 (the module docstring): this test fails for it. The interval must
    also be informative: its median width a factor under 1.4 (a 1.1 saving at this noise is not resolvable
    from 3 seeds, which the widths show)."""
    L = curve(3.0, 0.8, 0.35)
    rng = np.random.default_rng(1)
    hits, hits_free, widths, verdicts = 0, 0, [], set()
    for i in range(200):
        m0, m1 = experiment(rng, L)
        out = arm_multiplier(m0, m1, n_boot=200, seed=i)
        assert not out["extrapolated"] and "Welch" in out["interval_method"]
        low, high = out["multiplier_low"], out["multiplier_high"]
        assert low < out["multiplier"] < high
        hits += low <= 1.1 <= high
        hits_free += out["multiplier_free_low"] <= 1.1 / 0.6 <= out["multiplier_free_high"]
        widths.append(high / low)
        verdicts.add(out["saving"])
        assert out["saving"] == ("saving" if low > 1 else "costs more" if high < 1 else "no measurable saving")
    assert 0.90 <= hits / 200 <= 0.99, hits
    assert 0.90 <= hits_free / 200 <= 0.99, hits_free
    assert np.median(widths) < 1.4, np.median(widths)
    assert verdicts == {"saving", "no measurable saving"}


@pytest.mark.parametrize("m,verdict", [(1.6, "saving"), (0.6, "costs more"), (1.0, "no measurable saving")])
def test_the_verdict_follows_the_interval(m, verdict):
    L = curve(3.0, 0.8, 0.35)
    m0, m1 = experiment(np.random.default_rng(3), L, m=m, sd_seed=0.003, sd_eval=0.002, k0=4, k1=4)
    out = arm_multiplier(m0, m1, n_boot=300)
    assert out["saving"] == verdict and out["multiplier_low"] <= m <= out["multiplier_high"]
    again = arm_multiplier(m0, m1, n_boot=300)
    assert again == out  # seeded: the same tables give the same interval


def test_one_seed_gives_a_multiplier_without_an_interval():
    L = curve(3.0, 0.8, 0.35)
    m0, m1 = experiment(np.random.default_rng(0), L, k1=1)
    out = arm_multiplier(m0, m1, n_boot=50)
    assert 0.8 < out["multiplier"] < 1.5 and math.isnan(out["multiplier_low"]) and math.isnan(out["multiplier_high"])
    assert out["saving"] == "" and "fewer than 2 seeds" in out["interval_method"]


def test_bad_tables_are_refused_in_one_line():
    L = curve(3.0, 0.8, 0.35)
    m0, m1 = experiment(np.random.default_rng(0), L)
    with pytest.raises(GrowlmError, match="m1_finals lacks column.*flops_free"):
        arm_multiplier(m0, m1.drop(columns="flops_free"))
    with pytest.raises(GrowlmError, match="m0_ends is empty"):
        arm_multiplier(m0.iloc[:0], m1)
    m1.loc[1, "loss"] = np.nan
    with pytest.raises(GrowlmError, match="seed.*1 have no finite"):
        arm_multiplier(m0, m1)
    with pytest.raises(GrowlmError, match="level"):
        arm_multiplier(m0, m1.dropna(), level=95)


def test_finished_reach_reads_the_fit_or_the_lower_hull_and_never_below_the_lowest_end():
    # the hull: (2e15, 3.45) lies above the chord from (1e15, 3.5) to (4e15, 3.2) in log FLOPs (3.35 at 2e15),
    # and (3e15, 3.4) above the hull too; neither is part of the envelope
    ends = [(4 * U, 3.2), (1 * U, 3.5), (2 * U, 3.45), (3 * U, 3.4), (8 * U, 3.25)]
    assert finished_reach(ends, 3.4) == pytest.approx(U * 4 ** (1 / 3), rel=1e-12)
    assert finished_reach(ends, 3.2) == pytest.approx(4 * U)
    assert finished_reach(ends, 3.6) == U  # the first finished run already got there: nothing read before it
    assert math.isnan(finished_reach(ends, 3.19))  # below the lowest end: no extrapolation
    assert math.isnan(finished_reach([], 3.4))
    # with a fit, its curve, held within the ends' FLOPs
    L = curve(3.0, 0.8, 0.35)
    C = U * np.array(FRACTIONS)
    fit = fit_power_law(C, L(C))
    ends = list(zip(C, L(C)))
    target = float(L(0.6 * U))
    assert finished_reach(ends, target, fit) == pytest.approx(0.6 * U, rel=1e-6)
    assert finished_reach(ends, float(L(2 * U)), fit) == pytest.approx(2 * U, rel=1e-6)
    assert finished_reach(ends, 4.5, fit) == 0.2 * U  # above the first end (4.41): the fit would read 0.15 U
    assert math.isnan(finished_reach(ends, float(L(2.1 * U)), fit))
    # a refused fit falls back on the hull; the power law is convex in log C, so its hull runs above it
    hull = finished_reach(ends, target, Fit(why="refused"))
    assert hull == finished_reach(ends, target) and 0.6 * U < hull < 0.7 * U


def test_window_losses_are_read_only_where_they_are_the_ledgers_and_paired_by_nearest_loss(tmp_path):
    """A run's window losses (beside its ledger) are read where their mean is the ledger's final loss, not where
    they were left by an earlier run; M_1 is paired with M_0's finished run nearest its loss; an arm's error is
    that of its seeds' mean difference, and none where a seed has no windows."""
    from growlm.envelope import windows_path
    from growlm.runs import eval_error, final_windows, paired_windows

    cols = "step,tokens,flops,wall_s,lr,train_loss,val_loss,peak_mem_mb,kind\n"

    def run(folder, windows, loss=None):
        folder.mkdir(parents=True)
        loss = float(np.mean(windows)) if loss is None else loss
        (folder / "ledger.csv").write_text(cols + f"0,0,0,0,0,,5.0,1,eval\n10,100,1e9,1,0,4,{loss:.5f},1,eval\n")
        np.save(windows_path(folder / "ledger.csv"), np.asarray(windows, dtype=float))
        return folder

    rng = np.random.default_rng(0)
    hard = rng.normal(4.0, 0.5, 50)  # what every model finds hard: shared by the windows of every run
    m1 = run(tmp_path / "m1", hard - 0.1 + rng.normal(0, 0.01, 50))
    m0 = run(tmp_path / "m0", hard + rng.normal(0, 0.01, 50))  # its full run: 0.1 above M_1
    run(m0 / "branches" / "b50", hard + 0.5 + rng.normal(0, 0.01, 50))  # a branch, further from M_1's loss
    diff = paired_windows(m1, [m0], ["50"])
    assert diff == pytest.approx(np.load(windows_path(m1 / "ledger.csv")) - np.load(windows_path(m0 / "ledger.csv")))
    se, windows = eval_error([diff])
    assert windows == 50 and se == pytest.approx(diff.std(ddof=1) / math.sqrt(50)) and se < 0.01
    assert eval_error([diff, diff + 0.02])[0] == pytest.approx(se)  # the seeds' mean difference
    assert eval_error([diff, None]) == (pytest.approx(math.nan, nan_ok=True), 0)
    stale = run(tmp_path / "stale", hard, loss=3.0)  # windows left from another run: their mean is not the ledger's
    assert final_windows(stale / "ledger.csv") is None and paired_windows(stale, [m0]) is None
    assert final_windows(tmp_path / "nowhere" / "ledger.csv") is None
    windows_path(m0 / "ledger.csv").write_bytes(b"\x93NUMPY truncated")  # damaged: not read, and said in one line
    assert final_windows(m0 / "ledger.csv") is None and paired_windows(m1, [m0]) is None
