"""Paired statistics for the paper's claims, without scipy.

* :func:`betainc`: the regularized incomplete beta function I_x(a, b), by its continued
  fraction (modified Lentz), accurate to about 1e-14.
* :func:`t_cdf`, :func:`t_ppf`: Student's t distribution function and its quantile (by bisection
  on the distribution function, to 1e-12).
* :func:`paired`: mean, sample std (ddof=1), n and the two-sided Student-t interval
  mean ± t_{(1+level)/2, n-1} · sd / sqrt(n) of paired differences.
* :func:`verdict`: "shown" when the interval lies on the better side of 0, "contradicted" when it
  lies on the other side, "not shown" otherwise (and always with fewer than two pairs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean, stdev

from surecl.errors import SureclError

_EPS = 1e-15
_TINY = 1e-300


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of I_x(a, b) (Numerical Recipes ``betacf``), modified Lentz."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"betainc: continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if a <= 0 or b <= 0:
        raise ValueError("betainc: a and b must be positive")
    if not 0.0 <= x <= 1.0:
        raise ValueError("betainc: x must lie in [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast here; else use the symmetry
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError("t_cdf: df must be positive")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def t_ppf(p: float, df: float) -> float:
    """The quantile t_{p, df} of Student's t (e.g. ``t_ppf(0.975, 4)`` = 2.776)."""
    if not 0.0 < p < 1.0:
        raise ValueError("t_ppf: p must lie in (0, 1)")
    if df <= 0:
        raise ValueError("t_ppf: df must be positive")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Paired:
    """Summary of paired differences A - B."""

    n: int
    mean: float | None
    sd: float | None
    lo: float | None  # the confidence interval; None with fewer than two pairs
    hi: float | None
    t: float | None  # the t quantile used
    level: float = 0.95


def paired(diffs: list[float], level: float = 0.95) -> Paired:
    """Mean, sample std and the two-sided Student-t interval at ``level`` of ``diffs``."""
    if not 0.0 < level < 1.0:
        raise SureclError(f"confidence level must lie in (0, 1), not {level}")
    n = len(diffs)
    if n == 0:
        return Paired(0, None, None, None, None, None, level)
    mean = fmean(diffs)
    if n < 2:
        return Paired(1, mean, None, None, None, None, level)
    sd = stdev(diffs)
    t = t_ppf(0.5 + level / 2.0, n - 1)
    half = t * sd / math.sqrt(n)
    return Paired(n, mean, sd, mean - half, mean + half, t, level)


def verdict(res: Paired, higher_is_better: bool = True) -> tuple[str, str]:
    """("shown" | "contradicted" | "not shown", why) for the claim "A is better than B"."""
    if res.n == 0:
        return "not shown", "no (order, seed) pair has both rows"
    if res.n < 2:
        return "not shown", "n=1: an interval needs at least two pairs"
    assert res.lo is not None and res.hi is not None
    better_lo, better_hi = (res.lo, res.hi) if higher_is_better else (-res.hi, -res.lo)
    side = "above" if higher_is_better else "below"
    if better_lo > 0:
        return "shown", f"the whole interval lies {side} 0"
    if better_hi < 0:
        return "contradicted", f"the whole interval lies {'below' if higher_is_better else 'above'} 0"
    return "not shown", "the interval contains 0"
