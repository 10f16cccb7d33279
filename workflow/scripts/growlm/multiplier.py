"""The effective compute multiplier: how much compute M_0's fitted loss curve needs for M_1's final loss, over
what M_1 spent, with a 95% interval over seeds (and the evaluation's error, where it is given).

Why. Reading M_1's cost where its curve first reaches M_0's final loss (`growlm.compare.first_reach`, or the
envelope of `growlm.envelope`) needs a point of M_1's curve at that loss; unless a run of M_1 *ended* there, the
point lies inside a decay and is an upper bound, and the ratio's divisor is one noisy point of M_0. The field
reads a saving the other way round (Wen et al. 2025, arXiv 2509.02046, define a speed-up so): fit the baseline's
loss against compute from runs that *finished* (cooldown-branch ends, full-run ends, a budget sweep's runs, every
seed pooled), then ask how much compute that curve needs for the method's final loss. It uses only decayed end
points of M_1 and a smooth curve through many points of M_0, so a small offset at the end of training is read
against M_0's whole curve, not against one of its points.

The fit (`fit_power_law`). L(C) = E + A C^-alpha, fitted as Hoffmann et al. 2022 (arXiv 2203.15556) approach
3: the Huber loss (delta 1e-3) of the residual log L_pred - log L_obs, summed over the points and minimised with
L-BFGS-B from a grid of starting points, the best kept. Huber on log loss keeps one bad point (a diverged branch,
a short evaluation's outlier) from pulling the curve, and the grid keeps the fit off the poor local minima that
the E / alpha trade-off makes (Besiroglu et al. 2024, arXiv 2404.10102, show how far a single start can be off;
Porian et al. 2024, arXiv 2406.19146, fit the same way down to small models). E = exp(e) and A = exp(a) keep
E >= 0 and A > 0 without a constraint, and log L_pred = logsumexp(e, a - alpha log c) is computed stably; alpha
is bounded below by 1e-4. FLOPs are divided by their geometric mean inside the fit (raw FLOPs of 1e15 would put
the three parameters on scales that L-BFGS-B's curvature estimate cannot bridge); `Fit.A` is given back in
FLOPs' own units.

The multiplier (`arm_multiplier`). m = C_0(mean L_1) / mean C_1: above 1, growing paid (M_0 would need m times
M_1's FLOPs for M_1's loss). C_1 counts M_1's members and growth (`multiplier`) or leaves them free
(`multiplier_free`). Where C_0(L_1) lies past M_0's largest finished run (or before its smallest) the number is
an extrapolation of the fit (E dominates its error): `extrapolated` says so and `extrapolation_factor` by how
much. The way to avoid it is to run M_0 past the budget so its finished runs bracket M_1's final loss.

The interval. Seeds are the unit of replication: M_0's seeds (each with all its points) and M_1's seeds are
resampled with replacement, the curve refitted for each draw of M_0's seeds. With the 3-5 seeds an experiment
affords, a percentile bootstrap under-covers badly: the bootstrap distribution of a mean of k draws has variance
(k - 1)/k of the sample variance over k (a third too narrow at 3 seeds) and normal, not Student, tails, and at
k = 3 it takes only 10 distinct values. So the bootstrap is used only for what it does well here, the standard
error of log m through the nonlinear fit, and the interval is built as a Welch t-interval on log m:

- u_0 = the variance of log C_0(mean L_1) over draws of M_0's seeds (M_1's mean held), u_1 = the variance of
  log C_0(mean L_1) - log mean C_1 over draws of M_1's seeds (the pooled fit held); each is multiplied by
  k / (k - 1) for its own seed count (the bootstrap's variance bias for a mean);
- log m +- t_{df} sqrt(u_0 + u_1), df from Welch-Satterthwaite: (u_0 + u_1)^2 / (u_0^2/(k_0-1) + u_1^2/(k_1-1));
- the bounds are exponentiated back, so the interval is a ratio interval (asymmetric around m).

The evaluation's error (`eval_se`). Every model reads the same validation windows, so the part of each loss's
standard error that the windows share (a passage every model finds hard) cancels between M_1 and M_0. What is
left, the standard error of M_1's loss minus M_0's read on the same windows (`growlm.loss.window_losses`, the
windows' differences through `mean_and_se`), the seeds share too: more seeds do not shrink it and the bootstrap
over seeds does not see it. Where it is given it is carried through the fit's slope at L_1 (dL/dln C = -alpha
(L_1 - E), so ln C_0 moves by eval_se / (alpha (L_1 - E))) as a third variance u_e beside u_0 and u_1; the
degrees of freedom stay the seeds' (`_welch`), so the interval only widens. On a small validation split it is not
small.

Log m is close to linear in the seeds' mean offsets (ln m ~ Delta L / (alpha (L - E))), so this is the two-sample
t-interval of a difference of means, carried through the fit by the bootstrap. Measured on synthetic
experiments (`tests/test_multiplier.py`'s: M_0 at 7 budgets with a seed offset of 0.01 and evaluation noise of
0.004 in loss, M_1 drawn alike), the 95% interval held the true multiplier in 0.96 of 200 experiments of 3 seeds
a side, 0.93 of 100 of 5 a side and 0.95 of 100 of 5 and 3; a percentile bootstrap over the same resamples held
it in 0.81 of 100 of 3 a side. Distinct resamples of M_0's seeds are
fitted once (a multiset of 3 seeds has 10 forms), so the refits cost little. An interval needs at least 2 seeds
in each arm and finite draws; otherwise its bounds are NaN and `saving` is ''.

Torch-free (numpy, pandas, scipy): the comparison job and bench scripts call it on their tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, stats
from threadpoolctl import threadpool_limits

from growlm.errors import GrowlmError

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, approach 3
ALPHA_FLOOR = 1e-4
MIN_DRAWS = 0.9  # share of bootstrap draws whose refit must succeed for an interval


@dataclass
class Fit:
    """L(C) = E + A C^-alpha fitted to `n` points; `ok` False (with `why`) where the fit was refused."""

    E: float = math.nan
    A: float = math.nan
    alpha: float = math.nan
    n: int = 0
    ok: bool = False
    why: str = ""
    objective: float = field(default=math.nan, repr=False)  # the Huber sum at the optimum (compares starts)

    def loss_at(self, C):
        """The fitted loss at `C` FLOPs (a number or an array); NaN when the fit was refused."""
        if not self.ok:
            return np.nan * np.asarray(C, dtype=float) if np.ndim(C) else math.nan
        out = self.E + np.exp(math.log(self.A) - self.alpha * np.log(np.asarray(C, dtype=float)))
        return float(out) if np.ndim(out) == 0 else out

    def compute_for(self, loss) -> float:
        """The FLOPs C at which E + A C^-alpha = `loss`: inf where `loss` <= E (the curve never gets there),
        NaN when the fit was refused or `loss` is not finite."""
        loss = float(loss)
        if not self.ok or not math.isfinite(loss):
            return math.nan
        if loss <= self.E:
            return math.inf
        log_c = (math.log(self.A) - math.log(loss - self.E)) / self.alpha
        return math.exp(log_c) if log_c < 709 else math.inf


def _huber(theta, x, y, delta):
    """Sum of Huber(delta) of log L_pred - log L_obs over the points, divided by delta, and its gradient."""
    e, a, alpha = theta
    t = a - alpha * x
    lse = np.logaddexp(e, t)
    r = lse - y
    small = np.abs(r) <= delta
    value = np.where(small, 0.5 * r * r / delta, np.abs(r) - 0.5 * delta).sum()
    dr = np.where(small, r / delta, np.sign(r))
    w_e = np.exp(e - lse)
    w_a = np.exp(t - lse)
    grad = np.array([(dr * w_e).sum(), (dr * w_a).sum(), -(dr * w_a * x).sum()])
    return value, grad


def _starts(x, y, delta, keep: int = 4):
    """Starting points: Hoffmann et al.'s grid, adapted to normalised FLOPs (E at shares of the lowest loss,
    alpha from 0.05 to 3, A from the rest of the loss at the data's middle, x = 0, and up to e^2 either side),
    350 points whose objective is one array operation; L-BFGS-B then starts from the `keep` best. Starting
    from every grid point (Hoffmann et al.) costs about 90 times more: over 40 synthetic experiments like
    tests/test_multiplier.py's, L-BFGS-B from each of the 8 best points ended at the same optimum (objective
    within 4e-16), so the best 4 are kept, and the grid's breadth guards against the E / alpha trade-off's
    far minima."""
    low = math.exp(y.min())
    grid = []
    for share in (1e-3, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95):
        e = math.log(share * low)
        a0 = math.log(max(float(np.median(np.exp(y) - share * low)), 1e-6 * low))
        for alpha in (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0):
            grid += [(e, a0 + d, alpha) for d in (-2.0, -1.0, 0.0, 1.0, 2.0)]
    g = np.asarray(grid)
    r = np.logaddexp(g[:, :1], g[:, 1:2] - g[:, 2:3] * x[None, :]) - y[None, :]
    value = np.where(np.abs(r) <= delta, 0.5 * r * r / delta, np.abs(r) - 0.5 * delta).sum(axis=1)
    return [tuple(g[i]) for i in np.argsort(value, kind="stable")[:keep]]


def _minimise(x, y, starts, delta):
    best = None
    bounds = [(-30.0, float(y.max()) + 1.0), (-60.0, 60.0), (ALPHA_FLOOR, 10.0)]
    for start in starts:
        res = optimize.minimize(_huber, np.asarray(start, dtype=float), args=(x, y, delta), jac=True,
                                method="L-BFGS-B", bounds=bounds,
                                options={"maxiter": 2000, "ftol": 1e-12, "gtol": 1e-8})
        # status 0: converged; 2: the line search found no lower point (L-BFGS-B's end at the Huber kink, or
        # a start already at the optimum, as the bootstrap's warm starts are); 1: out of iterations
        if res.status in (0, 2) and np.all(np.isfinite(res.x)) and math.isfinite(res.fun):
            if best is None or res.fun < best.fun:
                best = res
    return best


def fit_power_law(compute, loss, *, delta: float = HUBER_DELTA, starts=None) -> Fit:
    """Fit L(C) = E + A C^-alpha to (compute, loss) points (Hoffmann et al. 2022 approach 3; module
    docstring). Refused (`ok` False, `why` saying why) with fewer than 3 distinct compute values, a non-finite
    or non-positive value, or no start converging. `starts`: (E, A, alpha) triples in FLOPs' own units to start
    from instead of the grid (the bootstrap starts its refits at the pooled optimum).

    The fit runs on one BLAS thread: L-BFGS-B calls BLAS on 3 x 3 matrices, where OpenBLAS's threads only
    wait on each other; measured on a loaded 2-core machine, one fit of 21 points took 9 s on OpenBLAS's
    default two threads and 0.12 s on one."""
    with threadpool_limits(1):
        return _fit(compute, loss, delta, starts)


def _fit(compute, loss, delta, starts) -> Fit:
    c = np.asarray(compute, dtype=float).ravel()
    v = np.asarray(loss, dtype=float).ravel()
    n = int(c.size)
    if c.size != v.size:
        raise GrowlmError(f"fit_power_law: {c.size} compute values but {v.size} losses")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(v))):
        return Fit(n=n, why="non-finite compute or loss")
    if np.any(c <= 0) or np.any(v <= 0):
        return Fit(n=n, why="compute and loss must be positive")
    if np.unique(c).size < 3:
        return Fit(n=n, why=f"{np.unique(c).size} distinct compute values (3 needed for E, A and alpha)")
    log_scale = float(np.log(c).mean())
    x, y = np.log(c) - log_scale, np.log(v)
    if starts is not None:
        starts = [(math.log(max(E, 1e-13)), math.log(A) - alpha * log_scale, alpha) for E, A, alpha in starts]
    best = _minimise(x, y, _starts(x, y, delta) if starts is None else starts, delta)
    if best is None:
        return Fit(n=n, why="no starting point converged")
    e, a, alpha = (float(t) for t in best.x)
    return Fit(E=math.exp(e), A=math.exp(a + alpha * log_scale), alpha=alpha, n=n, ok=True,
               objective=float(best.fun))


M0_COLUMNS = ("seed", "flops", "loss")
M1_COLUMNS = ("seed", "flops", "flops_free", "loss")


def _frame(df, columns, name) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise GrowlmError(f"{name} must be a table (DataFrame) with columns {', '.join(columns)}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise GrowlmError(f"{name} lacks column(s) {', '.join(missing)} (it needs {', '.join(columns)})")
    if df.empty:
        raise GrowlmError(f"{name} is empty: no finished run to read")
    return df[list(columns)].reset_index(drop=True)


def seed_multipliers(fit: Fit, m1_finals: pd.DataFrame) -> pd.DataFrame:
    """Each seed of M_1 read on one fit of M_0 (the pooled one): columns seed, loss, flops, flops_free,
    m0_flops (the FLOPs M_0's curve needs for the seed's final loss), multiplier and multiplier_free
    (m0_flops over the seed's FLOPs, members counted and free). NaN throughout when the fit was refused."""
    m1 = _frame(m1_finals, M1_COLUMNS, "m1_finals").copy()
    m1["m0_flops"] = [fit.compute_for(v) for v in m1["loss"]]
    m1["multiplier"] = m1["m0_flops"] / m1["flops"].astype(float)
    m1["multiplier_free"] = m1["m0_flops"] / m1["flops_free"].astype(float)
    return m1[["seed", "loss", "flops", "flops_free", "m0_flops", "multiplier", "multiplier_free"]]


def _variance(values, k) -> float:
    """The bootstrap variance of `values` times k/(k-1), its bias for a mean of k seeds; NaN where a draw is
    not finite (the curve never reached a draw's loss) or k < 2."""
    values = np.asarray(values, dtype=float)
    if k < 2 or not np.all(np.isfinite(values)):
        return math.nan
    return float(values.var(ddof=1)) * k / (k - 1)


def _welch(log_m, u0, k0, u1, k1, level, ue=0.0, ke=math.inf):
    """(low, high, df): log_m +- t_{df} sqrt(u0 + u1 + ue), exponentiated; df by Welch-Satterthwaite over the
    seeds' variances u0 and u1 (ke - 1, the evaluation's windows, where the seeds vary not at all). The evaluation's
    variance ue, read off hundreds of windows, would raise Satterthwaite's df and can so narrow the interval it
    adds to; it is kept out of the df, so that an interval with it is never narrower than the seeds' alone."""
    seeds = u0 + u1
    total = seeds + ue
    if not (math.isfinite(log_m) and math.isfinite(total)):
        return math.nan, math.nan, math.nan
    if total == 0:
        return math.exp(log_m), math.exp(log_m), math.inf
    df = seeds ** 2 / (u0 ** 2 / (k0 - 1) + u1 ** 2 / (k1 - 1)) if seeds > 0 else ke - 1
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(total)
    return math.exp(log_m - half), math.exp(log_m + half), df


def _saving(low, high) -> str:
    if not (low == low and high == high):
        return ""
    return "saving" if low > 1 else "costs more" if high < 1 else "no measurable saving"


def arm_multiplier(m0_ends: pd.DataFrame, m1_finals: pd.DataFrame, *, n_boot: int = 2000, level: float = 0.95,
                   seed: int = 0, eval_se: float = 0.0, eval_windows: int | None = None) -> dict:
    """One arm's effective compute multiplier against M_0's fitted curve, with its interval (module docstring).

    m0_ends: M_0's finished runs, columns seed, flops, loss (every run end: cooldown-branch ends and full-run
    ends, at every budget, every seed pooled). m1_finals: M_1's seeds, columns seed, flops (members and growth
    counted), flops_free (members free), loss (the seed's final loss). Returns the keys multiplier(_low,
    _high), multiplier_free(_low, _high), extrapolated, extrapolation_factor, m0_fit_E, m0_fit_A,
    m0_fit_alpha, m0_points, m0_seeds, m1_seeds, saving ('saving' where the interval lies above 1, 'no
    measurable saving' where it holds 1, 'costs more' where it lies below 1, '' without an interval),
    interval_method and eval_se. eval_se: the standard error of the seeds' mean final loss minus M_0's, read on
    the same `eval_windows` windows (module docstring); 0: the interval is over seeds alone."""
    if not (0 < level < 1):
        raise GrowlmError(f"arm_multiplier: level {level} must lie between 0 and 1 (0.95 for a 95% interval)")
    if int(n_boot) < 20:
        raise GrowlmError(f"arm_multiplier: n_boot {n_boot} is too few bootstrap draws (20 at least; 2000 usual)")
    m0 = _frame(m0_ends, M0_COLUMNS, "m0_ends")
    m1 = _frame(m1_finals, M1_COLUMNS, "m1_finals")
    bad = m1[~np.isfinite(m1[["flops", "flops_free", "loss"]].astype(float)).all(axis=1)
             | (m1["flops"].astype(float) <= 0) | (m1["flops_free"].astype(float) <= 0)]
    if len(bad):
        raise GrowlmError(f"m1_finals: seed(s) {', '.join(map(str, bad['seed']))} have no finite positive FLOPs "
                          "and final loss (a run that did not finish?)")
    eval_se = float(eval_se)
    if not (math.isfinite(eval_se) and eval_se >= 0):
        raise GrowlmError(f"arm_multiplier: eval_se {eval_se} must be a standard error, 0 or more")
    if eval_se > 0 and (eval_windows is None or int(eval_windows) < 2):
        raise GrowlmError(f"arm_multiplier: eval_se needs the number of windows it was read over (2 or more), "
                          f"not {eval_windows}")
    with threadpool_limits(1):
        return _arm(m0, m1, int(n_boot), float(level), seed, eval_se, int(eval_windows or 0))


def _arm(m0, m1, n_boot, level, seed, eval_se=0.0, eval_windows=0) -> dict:
    seeds0 = list(dict.fromkeys(m0["seed"]))
    k0, k1 = len(seeds0), len(m1)
    fit = _fit(m0["flops"], m0["loss"], HUBER_DELTA, None)
    out = {"m0_fit_E": fit.E, "m0_fit_A": fit.A, "m0_fit_alpha": fit.alpha, "m0_points": len(m0),
           "m0_seeds": k0, "m1_seeds": k1, "eval_se": eval_se}
    nan = {k: math.nan for k in ("multiplier", "multiplier_low", "multiplier_high", "multiplier_free",
                                 "multiplier_free_low", "multiplier_free_high", "extrapolation_factor")}
    if not fit.ok:
        return {**out, **nan, "extrapolated": False, "saving": "",
                "interval_method": f"none: M_0's fit refused ({fit.why})"}
    loss1 = m1["loss"].to_numpy(float)
    flops1, free1 = m1["flops"].to_numpy(float), m1["flops_free"].to_numpy(float)
    c0 = fit.compute_for(loss1.mean())
    largest, smallest = float(m0["flops"].max()), float(m0["flops"].min())
    factor = c0 / largest if c0 > largest else smallest / c0 if c0 < smallest else 1.0
    log_c0 = math.log(c0) if c0 > 0 else math.nan
    log_m, log_mf = log_c0 - math.log(flops1.mean()), log_c0 - math.log(free1.mean())
    out.update(multiplier=math.exp(log_m), multiplier_free=math.exp(log_mf), extrapolated=factor > 1,
               extrapolation_factor=factor)

    # M_0's side: its seeds resampled with their points and refitted; each distinct multiset of seeds once
    rng = np.random.default_rng(seed)
    groups = [m0[m0["seed"] == s] for s in seeds0]
    refits, log_c0_draws, failed = {}, [], 0
    start = [(fit.E, fit.A, fit.alpha)]
    for draw in rng.integers(0, k0, size=(n_boot, k0)):
        key = tuple(sorted(draw))
        if key not in refits:
            pts = pd.concat([groups[i] for i in key])
            refits[key] = _fit(pts["flops"], pts["loss"], HUBER_DELTA, start)
        if refits[key].ok:
            c = refits[key].compute_for(loss1.mean())
            log_c0_draws.append(math.log(c) if c > 0 else math.nan)
        else:
            failed += 1
    # M_1's side: its seeds resampled on the pooled fit
    draws1 = rng.integers(0, k1, size=(n_boot, k1))
    c0_1 = np.array([fit.compute_for(v) for v in loss1[draws1].mean(axis=1)])
    with np.errstate(divide="ignore", invalid="ignore"):
        log_c0_1 = np.log(c0_1)
    u0 = _variance(log_c0_draws, k0) if failed <= (1 - MIN_DRAWS) * n_boot else math.nan
    # the evaluation's error, through the fit's slope at L_1: dL/dln C = -alpha (L_1 - E)
    slope = fit.alpha * (loss1.mean() - fit.E)
    ue = 0.0 if eval_se == 0 else (eval_se / slope) ** 2 if slope > 0 else math.nan
    low, high, df = _welch(log_m, u0, k0, _variance(log_c0_1 - np.log(flops1[draws1].mean(axis=1)), k1), k1,
                           level, ue, eval_windows)
    low_f, high_f, _ = _welch(log_mf, u0, k0, _variance(log_c0_1 - np.log(free1[draws1].mean(axis=1)), k1), k1,
                              level, ue, eval_windows)
    method = (f"{level:.0%} Welch t on log m, bootstrap SE over seeds ({n_boot} draws, {len(refits)} refits)"
              + (f" and the evaluation's SE {eval_se:.4f} over {eval_windows} windows" if eval_se else "")
              + f", df {df:.1f}")
    if not (low == low):
        why = ("fewer than 2 seeds in an arm" if min(k0, k1) < 2 else
               f"{failed} of {n_boot} refits refused" if failed > (1 - MIN_DRAWS) * n_boot else
               "a draw's loss lies at or below the fitted E")
        method = f"none: {why}"
    out.update(multiplier_low=low, multiplier_high=high, multiplier_free_low=low_f, multiplier_free_high=high_f,
               saving=_saving(low, high), interval_method=method)
    return out
