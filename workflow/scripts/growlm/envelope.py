"""The loss a budget buys, as the field measures it: each arm's envelope of runs that ended there.

Why. A run's loss at step t of a schedule planned for T > t steps is higher than the final loss of a
run planned for t steps: its rate has not decayed yet, and under warmup-stable-decay (wsd) most of the
loss falls in the final decay. So the FLOPs at which M_1 *first* reaches M_0's final loss inside M_1's
own full schedule (`growlm.compare.first_reach`, the comparison's "within one schedule" columns) are an
upper bound on what growth needs. The field measures the loss a budget buys with a run whose schedule
ends at that budget: Chinchilla's envelope over runs of several lengths (Hoffmann et al. 2022, arXiv
2203.15556, approach 1); under wsd, one run and a short cooldown branched from several points of its
stable phase (Hägele et al. 2024, arXiv 2405.18392; MiniCPM, arXiv 2404.06395), each branch a complete
wsd run of a shorter budget (`growlm.train_config.TrainConfig.branch`).

What. An arm's runs are its full run and every branch, each a curve of (FLOPs, validation loss) at its
evaluations (a branch's curve is the full run's up to where it left, then its cooldown; its last point is
a run that ended there). A run's loss between two evaluations is read by interpolating in log FLOPs (the
curves are close to straight there; linearly from a point at 0 FLOPs). The arm's envelope at C is the
lowest loss any of its runs reached at or below C FLOPs, so the FLOPs at which it first reaches a loss
are the least of its runs' first crossings (`reach`): never above the full run's first crossing alone
(`growlm.compare.first_reach` interpolates linearly, and a log-FLOPs interpolation between the same two
points never lies right of it), and strictly below it where a branch ends lower than the full run is
at those FLOPs. `saving_curve` divides M_1's envelope FLOPs by M_0's at every loss both reach: the
saving at each loss (G_stack's "speedup at equal loss", Du et al. 2024, arXiv 2405.15319).

The branches' cooldown FLOPs are the measurement's own cost, charged to no arm (`cooldown_flops`).
Under the cosine the same numbers come from a sweep over `budgets`: each budget's run is one of the arm's
runs (it ended at its own budget).

Finished runs only. `reach` counts every point of every run, the points inside the full run's own decay
included. A point inside a run's decay is not a run that ended there: its rate had not reached the floor,
and a run planned to end at those FLOPs would have annealed lower, so where no branch ends below the target
`reach` falls back on the full run's own crossing, the upper bound this module was written to avoid (at 32
tokens per parameter no branch at 0.2-0.7 of the stable phase ends below M_0's final loss, and the two
readings agree to 1e-5: bench/results/envelope_seeds.csv). That reading keeps its place only as "within one schedule" (`reach`, `saving_curve`
and their callers). An arm's envelope of finished runs (`finished_reach`) is made of its runs' *ends* only
(branch ends, the full run's end, a sweep's budgets), joined by the arm's fitted curve L(C) = E + A C^-alpha
(`growlm.multiplier.fit_power_law`) where the fit was accepted, or, where it was refused, by their lower
convex hull in log FLOPs (the power law is convex in log C, so the hull is the tightest curve of that shape
through the ends). It reads nothing below the lowest end: reading a loss beyond the finished runs is the
fit's extrapolation, which `growlm.multiplier.arm_multiplier` does and flags.

Torch-free and pandas-free: plain lists of pairs (the Snakefile's parse imports this module).
"""

from __future__ import annotations

import math
from pathlib import Path

Point = tuple[float, float]  # (FLOPs, validation loss)


def point_id(fraction: float) -> str:
    """The path-safe name of a branch point, a fraction of the stable phase in percent: 0.35 -> '35'."""
    return f"{100 * float(fraction):g}"


def windows_path(ledger_path):
    """Where a run's last evaluation keeps each validation window's mean loss: beside its ledger,
    `ledger.val_windows.npy` for `ledger.csv` (growlm.train writes it, growlm.runs.final_windows reads it), so
    that two runs' ends can be compared on the same windows."""
    return Path(ledger_path).with_suffix(".val_windows.npy")


def _run(points) -> list[Point]:
    return sorted((float(f), float(v)) for f, v in points if math.isfinite(float(f)) and math.isfinite(float(v)))


def crossing(run, target: float) -> float:
    """FLOPs at which one run's curve (its (FLOPs, loss) points) first reaches `target`, interpolated in log
    FLOPs between the evaluation before and the first at or below it (linearly from a point at 0 FLOPs);
    NaN where it never does."""
    prev = None
    for flops, loss in _run(run):
        if loss <= target:
            if prev is None or prev[1] == loss:
                return flops
            frac = (prev[1] - target) / (prev[1] - loss)
            if prev[0] <= 0:
                return prev[0] + frac * (flops - prev[0])
            return math.exp(math.log(prev[0]) + frac * (math.log(flops) - math.log(prev[0])))
        prev = (flops, loss)
    return math.nan


def reach(runs, target: float) -> float:
    """FLOPs at which an arm's envelope first reaches `target`: the least first crossing of its runs (each
    a list of (FLOPs, loss) points); NaN where no run reaches it."""
    found = [c for c in (crossing(run, target) for run in runs) if c == c]
    return min(found) if found else math.nan


def covered(runs) -> tuple[float, float]:
    """(lowest, highest) loss an arm's envelope covers: the lowest any run reached, the highest first point."""
    runs = [_run(r) for r in runs if _run(r)]
    if not runs:
        return math.nan, math.nan
    return min(v for r in runs for _, v in r), max(r[0][1] for r in runs)


def lowest(runs, flops: float) -> float:
    """The envelope at `flops`: the lowest loss any run reached at or below it (a run's loss between two
    evaluations read in log FLOPs); NaN before every run's first point."""
    best = math.nan
    for run in (_run(r) for r in runs):
        for i, (f, v) in enumerate(run):
            if f > flops:
                if i:  # part of the way to this point
                    (f0, v0) = run[i - 1]
                    t = ((math.log(flops) - math.log(f0)) / (math.log(f) - math.log(f0)) if f0 > 0
                         else (flops - f0) / (f - f0))
                    v = v0 + t * (v - v0)
                    best = v if not best <= v else best
                break
            best = v if not best <= v else best
    return best


def saving_curve(m0_runs, m1_runs, *, steps: int = 25) -> list[dict]:
    """M_1's envelope FLOPs over M_0's at `steps` losses evenly spaced over the range both envelopes cover
    (M_1's FLOPs with what it is charged before its refinement - its members and growth - already added).
    Each row: loss, m0_flops, m1_flops, ratio. Empty when the ranges do not overlap."""
    (low0, high0), (low1, high1) = covered(m0_runs), covered(m1_runs)
    low, high = max(low0, low1), min(high0, high1)
    if not (low < high):
        return []
    rows = []
    for i in range(steps):
        loss = high - (high - low) * i / (steps - 1)
        c0, c1 = reach(m0_runs, loss), reach(m1_runs, loss)
        if c0 > 0 and c1 == c1:
            rows.append({"loss": loss, "m0_flops": c0, "m1_flops": c1, "ratio": c1 / c0})
    return rows


def _lower_hull(points: list[Point]) -> list[Point]:
    """The lower convex hull of (FLOPs, loss) points in (log FLOPs, loss), left to right (the lowest loss at
    each FLOPs kept): Andrew's monotone chain."""
    best: dict[float, float] = {}
    for f, v in points:
        if f > 0:
            best[f] = min(v, best.get(f, v))
    hull: list[tuple[float, float, float]] = []  # (log FLOPs, loss, FLOPs)
    for f in sorted(best):
        p = (math.log(f), best[f], f)
        while len(hull) >= 2:
            (x1, y1, _), (x2, y2, _) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0:  # hull[-1] lies on or above the chord
                hull.pop()
            else:
                break
        hull.append(p)
    return [(f, v) for _, v, f in hull]


def finished_reach(ends, target: float, fit=None) -> float:
    """FLOPs at which an arm's envelope of finished runs first reaches `target` (module docstring). `ends`:
    its run ends, (FLOPs, loss) pairs. With `fit` (a `growlm.multiplier.Fit`) accepted, the fitted curve's
    FLOPs for the target; otherwise the lower hull of the ends, read in log FLOPs between the two hull points
    around the target. NaN where the target lies below the lowest end (no extrapolation here) or there are
    no ends. Where the target lies above the first end (the smallest run already got there), the answer is
    that run's FLOPs: nothing below the finished runs is read either; a fitted curve's reading is held
    within the ends' FLOPs for the same reason."""
    ends = [(f, v) for f, v in _run(ends) if f > 0]
    target = float(target)
    if not ends or not target >= min(v for _, v in ends):
        return math.nan
    smallest, largest = ends[0][0], ends[-1][0]
    if fit is not None and fit.ok:
        return min(max(fit.compute_for(target), smallest), largest)
    hull = _lower_hull(ends)
    if hull[0][1] <= target:
        return hull[0][0]
    for (f0, v0), (f1, v1) in zip(hull, hull[1:]):
        if v1 <= target:
            frac = (v0 - target) / (v0 - v1)
            return math.exp(math.log(f0) + frac * (math.log(f1) - math.log(f0)))
    return math.nan  # not reached: the lowest end lies on the hull
