"""Statistics of a study across seeds: mean, sample standard deviation, Student-t 95% intervals, and the paired
t-test of a variant against the reference over the seeds both have.

With n seeds the interval is ``mean +- t_{0.975, n-1} * sd / sqrt(n)``; the paired test works on the per-seed
differences ``d_s = x_s - ref_s`` (same seed, so the same data order and initialisation where the variants allow),
``t = mean(d) / (sd(d) / sqrt(n))`` with n - 1 degrees of freedom, two-sided p. The t quantiles come from
``scipy.stats.t`` (SciPy arrives with scikit-image / scikit-learn; imported inside the functions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Paired", "Summary", "paired", "summarise", "t_quantile"]


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(q, df))


@dataclass(frozen=True)
class Summary:
    """n values: their mean, sample sd (n - 1), and the 95% t-interval (nan bounds when n < 2)."""

    n: int
    mean: float
    sd: float
    low: float
    high: float


def summarise(values: Sequence[float], level: float = 0.95) -> Summary:
    """Mean, sample standard deviation and the ``level`` t-interval of the mean of finite ``values``."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan)
    mean = sum(xs) / n
    if n < 2:
        return Summary(1, mean, math.nan, math.nan, math.nan)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return Summary(n, mean, sd, mean - half, mean + half)


@dataclass(frozen=True)
class Paired:
    """The paired comparison of a variant with the reference over n common seeds."""

    n: int
    diff: Summary  # of the per-seed differences (variant - reference)
    t: float
    p: float


def paired(values: dict[int, float], reference: dict[int, float], level: float = 0.95) -> Paired:
    """Paired t-test of ``values`` against ``reference`` (seed -> value) over the seeds both have.

    ``t`` is nan with fewer than 2 common seeds; with zero spread of the differences it is +-inf (p 0) unless
    the mean difference is 0 too (t nan, p 1).
    """
    from scipy import stats

    seeds = sorted(s for s in set(values) & set(reference) if _finite(values[s]) and _finite(reference[s]))
    d = [float(values[s]) - float(reference[s]) for s in seeds]
    summary = summarise(d, level)
    n = len(d)
    if n < 2:
        return Paired(n, summary, math.nan, math.nan)
    if summary.sd == 0:
        if summary.mean == 0:
            return Paired(n, summary, math.nan, 1.0)
        return Paired(n, summary, math.copysign(math.inf, summary.mean), 0.0)
    t = summary.mean / (summary.sd / math.sqrt(n))
    p = float(2 * stats.t.sf(abs(t), n - 1))
    return Paired(n, summary, t, p)


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(float(v))
