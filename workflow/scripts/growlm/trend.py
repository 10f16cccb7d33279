"""How the effective compute multiplier moves with the model's size, and what it predicts for a size not measured.

Why. An experiment measures the multiplier (growlm.multiplier: the FLOPs M_0's fitted curve of finished runs needs
for M_1's final loss, over M_1's FLOPs) at the sizes a user can afford; what a user wants to know is the multiplier at
the size they mean to train. Published growth results are stated at one size each or as a trend over sizes (Deep
Progressive Training, arXiv 2511.04981, a gain growing from 0.25B to 2B parameters; G_stack, arXiv 2405.15319, a
speed-up holding from 410M to 7B), none below about 100M parameters. This module fits the trend over the measured
sizes and reads it at a named size, labelled as the extrapolation it is.

The trend (`fit_trend`). At one budget in tokens per non-embedding parameter (Kaplan et al.'s N, the count
comparison.csv's `tokens_per_param` divides by) and one arm, log m = a + b log N, least squares over every seed of
every size: each seed's multiplier (`seed_multiplier`, read on its size's pooled fit of M_0) is a point at its size's
log N. A power law in N is the form scaling results take and the one a ratio of two power-law costs has; with 2-5
sizes it is also all the data can hold (a curvature would need a fourth point to be tested at all). b > 0: the saving
grows with size.

Its interval. Seeds are the unit of replication, as in growlm.multiplier, and the same argument applies: a percentile
bootstrap of a mean of 3 seeds is a third too narrow, with normal tails. So the bootstrap gives the standard error and
a t quantile the interval:

- each draw resamples every size's seeds with replacement (their deviations from the size's mean, each times
  sqrt(k / (k - 1)) for the size's k seeds, so that a resampled mean has the sample variance over k, not (k - 1)/k
  of it; a size measured with one seed draws from every size's deviations pooled), and refits the line; the
  standard error of any linear reading of the line (its slope, its value at log N*) is the spread of that reading
  over the draws;
- its degrees of freedom are Welch-Satterthwaite's over the sizes: the reading is sum_i c_i ybar_i, each size's
  share v_i = c_i^2 s_i^2 / k_i has k_i - 1 degrees of freedom, df = (sum v_i)^2 / sum v_i^2 / (k_i - 1);
- the slope's interval and the line's (`line_low`, `line_high`: where the trend itself lies at N*) are the reading
  +- t_df SE, exponentiated for the multiplier.

The prediction interval (`low`, `high`) is for what a new size N* will *measure*, the thing a run checks: the line's
value at N* plus a new size's own seed noise, the pooled within-size variance of log m over the k* seeds it will run
(`seeds`, by default the measured sizes' median), whose pooled variance is itself a sum of the sizes' variances, so
that Welch-Satterthwaite's degrees of freedom count each size once; it is never narrower than the line's (the
added part's degrees of freedom can lower the t quantile by more than its variance widens the sum).

Measured on synthetic ladders (tests/test_trend.py's: log m on a straight line in log N, seed spread 0.05 in log m,
N* ten times past the largest of sizes 0.34M, 1.1M and 3.7M): with 3 sizes of 3 seeds the prediction interval held
the new size's measurement in 0.97 of 400 draws, the line's interval the true line in 0.97, the slope's the true
slope in 0.975 (without the scale factor below, the first two 0.94 and 0.95); with 2 sizes of 3 seeds, 0.95, 0.955
and 0.96; with a seed spread falling with size, 0.95-0.99.

What it does not count. Every seed of a size is read on that size's one fit of M_0, so M_0's own seed noise is
shared by the size's points, and a real trend need not be straight in log-log: both move a size's mean off the line
by more than its seeds explain. With three or more sizes the residual scatter of the size means is compared with
what the seeds explain (chi-square over S - 2 degrees of freedom, `scatter`, the Birge ratio); where it is above 1
every variance is scaled by it (the Particle Data Group's scale factor; it widens the intervals a little where the
line is straight, the price of 0.97 for 0.95 above, and where a size's mean is off the line it is what widens them).
With two sizes nothing can show such a deviation: the interval is the seeds' alone, and the sentence says so.
A prediction past the largest measured size is an extrapolation (`reach` = N*/N_max); the error of a fitted slope
grows with the distance in log N, which the interval carries, but not the risk that the trend bends there.

Inputs. growlm.predict gives the trend its points from comparison.csv rows or curves.csv files made anywhere, and
prints it (`python -m growlm.predict`, bench/predict.py).

Torch-free (numpy, pandas, scipy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from growlm.errors import GrowlmError

LEVEL = 0.95
N_BOOT = 2000


@dataclass
class Prediction:
    """The trend read at `params` non-embedding parameters (module docstring): the fitted multiplier, the interval
    of what a size run with `seeds` seeds would measure (`low`, `high`) and of the line itself (`line_low`,
    `line_high`), `reach` = params over the largest measured size (below 1: inside or below the measured sizes)."""

    params: float
    multiplier: float
    low: float
    high: float
    line_low: float
    line_high: float
    seeds: int
    smallest: float
    largest: float
    level: float = LEVEL

    @property
    def reach(self) -> float:
        return self.params / self.largest

    @property
    def extrapolated(self) -> bool:
        return not (self.smallest <= self.params <= self.largest)

    @property
    def label(self) -> str:
        """Where N* lies against the measured sizes, in words."""
        if self.params > self.largest:
            return (f"an extrapolation {times(self.reach)} times past the largest measured size "
                    f"({fmt_params(self.largest)} non-embedding parameters)")
        if self.params < self.smallest:
            return (f"an extrapolation {times(self.smallest / self.params)} times below the smallest measured size "
                    f"({fmt_params(self.smallest)})")
        return f"an interpolation between the measured sizes ({fmt_params(self.smallest)}-{fmt_params(self.largest)})"


@dataclass
class Trend:
    """log m = intercept + slope log N fitted over `sizes` (non-embedding parameters) with `seeds` seeds each;
    `ok` False (with `why`) where it was refused. `slope_low`/`slope_high`: its interval; `scatter`: the Birge ratio
    of the size means (NaN with two sizes)."""

    intercept: float = math.nan
    slope: float = math.nan
    slope_low: float = math.nan
    slope_high: float = math.nan
    sizes: tuple = ()
    seeds: tuple = ()
    scatter: float = math.nan
    level: float = LEVEL
    ok: bool = False
    why: str = ""
    # what the readings need: the sizes' log N, each size's variance of one seed's log m and its degrees of
    # freedom, and the bootstrap's draws of (intercept, slope)
    _x: np.ndarray = field(default=None, repr=False)
    _var: np.ndarray = field(default=None, repr=False)
    _df: np.ndarray = field(default=None, repr=False)
    _draws: np.ndarray = field(default=None, repr=False)

    def multiplier_at(self, params):
        """The fitted multiplier at `params` (a number or an array)."""
        out = np.exp(self.intercept + self.slope * np.log(np.asarray(params, dtype=float)))
        return float(out) if np.ndim(out) == 0 else out

    def _reading(self, params, k_new: int | None = None):
        """(log m, low, high) at each of `params`: the line's value, or with `k_new` what a size run with that
        many seeds would measure (the line plus the pooled seed variance over k_new). The standard error is the
        bootstrap's (plus the new size's part), the degrees of freedom Welch-Satterthwaite's over the sizes' seed
        variances (each with k_i - 1), the whole scaled by the Birge ratio where the size means scatter more than
        their seeds explain."""
        x = np.log(np.atleast_1d(np.asarray(params, dtype=float)))
        centre = self.intercept + self.slope * x
        boot = self._draws[:, :1] + self._draws[:, 1:2] * x[None, :]
        total = boot.var(axis=0, ddof=1)
        parts = self._shares(x)  # (sizes, points): each size's variance's share of the reading
        if k_new is not None:  # the pooled variance is sum_i (k_i - 1) var_i / sum (k_i - 1): each size's part
            weight = (np.asarray(self.seeds, dtype=float) - 1).clip(min=0)
            weight = weight / weight.sum()
            new = (weight * self._var)[:, None] / k_new
            parts = parts + new
            total = total + new.sum(axis=0)
        denominator = (parts ** 2 / self._df[:, None]).sum(axis=0)
        df = np.where(denominator > 0, parts.sum(axis=0) ** 2 / np.where(denominator > 0, denominator, 1.0), np.inf)
        if self.scatter == self.scatter and self.scatter > 1:
            total = total * self.scatter
        half = stats.t.ppf(0.5 + self.level / 2, df) * np.sqrt(total)
        return centre, centre - half, centre + half

    def _shares(self, x):
        """v_i = c_i^2 var_i / k_i for the line's value at each x: c_i = k_i (1/K + (x - xbar)(x_i - xbar)/Sxx), the
        weight of size i's mean in the least-squares line over every seed."""
        k = np.asarray(self.seeds, dtype=float)
        xbar = (k * self._x).sum() / k.sum()
        sxx = (k * (self._x - xbar) ** 2).sum()
        c = k[:, None] * (1 / k.sum() + (x[None, :] - xbar) * (self._x - xbar)[:, None] / sxx)
        return c ** 2 * (self._var / k)[:, None]

    def band(self, params) -> tuple[np.ndarray, np.ndarray]:
        """The line's interval at each of `params`: (low, high) multipliers (the figure's band)."""
        _, low, high = self._reading(params)
        return np.exp(low), np.exp(high)

    def predict(self, params: float, seeds: int | None = None) -> Prediction:
        """The trend read at `params` non-embedding parameters (module docstring); `seeds`: those the size would be
        measured with (None: the measured sizes' median)."""
        if not self.ok:
            raise GrowlmError(f"no trend to predict from: {self.why}")
        if not (isinstance(params, (int, float)) and math.isfinite(params) and params > 0):
            raise GrowlmError(f"predict: params {params!r} must be a positive number of non-embedding parameters")
        k = int(seeds) if seeds is not None else int(np.median(self.seeds))
        if k < 1:
            raise GrowlmError(f"predict: seeds {seeds} must be at least 1")
        centre, low, high = self._reading([params], k)
        _, line_low, line_high = self._reading([params])
        # a measurement varies more than the line it scatters about: where the added part's many degrees of freedom
        # lower the t quantile enough to narrow the sum (Welch-Satterthwaite's), the line's interval stands
        low, high = np.minimum(low, line_low), np.maximum(high, line_high)
        return Prediction(params=float(params), multiplier=float(np.exp(centre[0])), low=float(np.exp(low[0])),
                          high=float(np.exp(high[0])), line_low=float(np.exp(line_low[0])),
                          line_high=float(np.exp(line_high[0])), seeds=k, smallest=min(self.sizes),
                          largest=max(self.sizes), level=self.level)


def fit_trend(points: pd.DataFrame, *, column: str = "multiplier", n_boot: int = N_BOOT, level: float = LEVEL,
              seed: int = 0) -> Trend:
    """The trend log m = a + b log N over `points` (columns params, seed and `column`: one row per size and seed;
    module docstring). Refused (`ok` False, `why`) with fewer than two sizes, or where no size has two seeds (no
    spread to draw from); a seed whose multiplier is not a positive number (the fit of M_0 refused, a loss M_0's
    curve never reaches) is left out and counted in `why`."""
    if not (0 < level < 1):
        raise GrowlmError(f"fit_trend: level {level} must lie between 0 and 1 (0.95 for a 95% interval)")
    if int(n_boot) < 20:
        raise GrowlmError(f"fit_trend: n_boot {n_boot} is too few bootstrap draws (20 at least; 2000 usual)")
    missing = [c for c in ("params", "seed", column) if c not in points]
    if missing:
        raise GrowlmError(f"fit_trend: the points lack column(s) {', '.join(missing)}")
    m = pd.to_numeric(points[column], errors="coerce").to_numpy(float)
    n = pd.to_numeric(points["params"], errors="coerce").to_numpy(float)
    good = np.isfinite(m) & (m > 0) & np.isfinite(n) & (n > 0)
    left = f"; {int((~good).sum())} seed(s) without a multiplier left out" if (~good).any() else ""
    n, y = n[good], np.log(m[good])
    sizes = np.unique(n)
    if sizes.size < 2:
        return Trend(level=level, sizes=tuple(sizes), why=f"{sizes.size} size(s) measured (a trend needs 2){left}")
    groups = [y[n == s] for s in sizes]
    k = np.array([g.size for g in groups])
    if k.max() < 2:
        return Trend(level=level, sizes=tuple(sizes), seeds=tuple(k),
                     why=f"one seed per size: no spread over seeds to draw an interval from{left}")
    x = np.log(n)
    design = np.column_stack([np.ones_like(x), x])
    solve = np.linalg.pinv(design)  # least squares over every seed: (a, b) = solve @ y
    a, b = solve @ y
    means = np.array([g.mean() for g in groups])
    dev = [(g - g.mean()) * math.sqrt(g.size / (g.size - 1)) if g.size > 1 else None for g in groups]
    pooled_dev = np.concatenate([d for d in dev if d is not None])
    resid_df = float(sum(g.size - 1 for g in groups))
    pooled_var = float(sum(((g - g.mean()) ** 2).sum() for g in groups) / resid_df)
    var = np.array([g.var(ddof=1) if g.size > 1 else pooled_var for g in groups])
    df = np.array([g.size - 1 if g.size > 1 else resid_df for g in groups], dtype=float)

    rng = np.random.default_rng(seed)
    order = np.argsort(n, kind="stable")
    index = np.searchsorted(sizes, n[order])
    ys = np.empty((int(n_boot), y.size))
    for i, (mean, d, ki) in enumerate(zip(means, dev, k)):
        pool = d if d is not None else pooled_dev
        ys[:, index == i] = mean + rng.choice(pool, size=(int(n_boot), int(ki)), replace=True)
    draws = ys @ np.linalg.pinv(design[order]).T  # (n_boot, 2): each draw's refit

    scatter = math.nan
    if sizes.size >= 3:  # the size means' residual scatter against what the seeds explain (Birge ratio)
        fitted = a + b * np.log(sizes)
        scatter = float(((means - fitted) ** 2 / (var / k)).sum() / (sizes.size - 2))
    trend = Trend(intercept=float(a), slope=float(b), sizes=tuple(float(s) for s in sizes),
                  seeds=tuple(int(v) for v in k), scatter=scatter, level=level, ok=True, why=left.removeprefix("; "),
                  _x=np.log(sizes), _var=var, _df=df, _draws=draws)
    slope_se = float(draws[:, 1].std(ddof=1))
    k_f = k.astype(float)
    xbar = (k_f * trend._x).sum() / k_f.sum()
    c = k_f * (trend._x - xbar) / (k_f * (trend._x - xbar) ** 2).sum()
    v = c ** 2 * var / k_f
    slope_df = v.sum() ** 2 / (v ** 2 / df).sum() if (v ** 2).sum() > 0 else math.inf
    total = slope_se ** 2
    if scatter == scatter and scatter > 1:
        total = total * scatter
    half = float(stats.t.ppf(0.5 + level / 2, slope_df)) * math.sqrt(total)
    trend.slope_low, trend.slope_high = float(b - half), float(b + half)
    return trend


def times(x: float) -> str:
    """A factor in words' digits: 33.5, 1,240."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def fmt_params(n: float) -> str:
    """124000000 -> '124M', 3.7e6 -> '3.7M', 5e9 -> '5B'."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"
