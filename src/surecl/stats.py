"""Paired statistics for the paper's claims, without scipy.

* :func:`betainc`: the regularized incomplete beta function I_x(a, b), by its continued
  fraction (modified Lentz), accurate to about 1e-14.
* :func:`t_cdf`, :func:`t_ppf`: Student's t distribution function and its quantile (by bisection
  on the distribution function, to 1e-12).
* :func:`paired`: mean, sample std (ddof=1), n, the two-sided Student-t interval
  mean ± t_{(1+level)/2, n-1} · sd / sqrt(n) of paired differences, the t statistic
  mean / (sd / sqrt(n)) and its two-sided p-value (:func:`t_test_p`).
* :func:`sign_test`: the exact two-sided sign test (binomial with p = 1/2, ties dropped).
* :func:`holm`: Holm's step-down adjustment of a family of p-values (monotone, capped at 1).
* :func:`p_verdict`: the claims' verdict from an adjusted p-value: "shown" when p < alpha and
  the mean favours A, "contradicted" when p < alpha and it favours B, "not shown" otherwise.
* :func:`verdict`: the interval's verdict: "shown" when the interval lies on the better side of
  0, "contradicted" when it lies on the other side, "not shown" otherwise (and always with fewer
  than two pairs).
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
    t_stat: float | None = None  # mean / (sd / sqrt(n)); None without spread (see paired)
    p: float | None = None  # two-sided paired t-test p-value; None with fewer than two pairs or no spread


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
    if sd <= NO_SPREAD * max(1.0, abs(mean)):
        # every difference equal (or equal but for float rounding): the t statistic would be
        # infinite and p 0 however few the units (two equal differences would be "shown");
        # the t-test says nothing here, the sign test still does
        return Paired(n, mean, sd, mean - half, mean + half, t, level, None, None)
    t_stat = mean / (sd / math.sqrt(n))
    return Paired(n, mean, sd, mean - half, mean + half, t, level, t_stat, t_test_p(t_stat, n - 1))


NO_SPREAD = 1e-9
"""Differences whose sample std is at most this times max(1, |mean|) have no spread: no t-test."""


def t_test_p(t: float, df: float) -> float:
    """Two-sided p-value P(|T| >= |t|) of Student's t with ``df`` degrees of freedom
    (``t_test_p(2.0, 10)`` = 0.0734)."""
    if df <= 0:
        raise ValueError("t_test_p: df must be positive")
    if math.isnan(t):
        raise ValueError("t_test_p: t is NaN")
    if math.isinf(t):
        return 0.0
    return min(1.0, betainc(df / 2.0, 0.5, df / (df + t * t)))


@dataclass(frozen=True)
class SignTest:
    """Exact two-sided sign test of paired differences: A wins (> 0), losses (< 0), ties (= 0,
    dropped) and the p-value 2 · P(X <= min(wins, losses)), X ~ Binomial(wins + losses, 1/2),
    capped at 1 (1 when every difference is a tie)."""

    wins: int
    losses: int
    ties: int
    p: float


def sign_test(diffs: list[float]) -> SignTest:
    """The exact two-sided sign test of ``diffs`` (ties dropped)."""
    wins = sum(1 for d in diffs if d > 0)
    losses = sum(1 for d in diffs if d < 0)
    n = wins + losses
    ties = len(diffs) - n
    if n == 0:
        return SignTest(0, 0, ties, 1.0)
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return SignTest(wins, losses, ties, min(1.0, 2.0 * tail))


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of one family of p-values, in the input order: with the m
    p-values sorted p_(1) <= ... <= p_(m), p_adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)).
    ``None`` entries (claims that could not be tested) stay None and do not count in m.
    ``holm([0.01, 0.04, 0.03])`` = [0.03, 0.06, 0.06]."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    m = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(idx):
        p = pvalues[i]
        assert p is not None
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"holm: p-value {p} is not in [0, 1]")
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


NO_SPREAD_WHY = "every difference equal: no spread, so no t-test (see the sign test)"


def p_verdict(mean: float | None, p_adj: float | None, higher_is_better: bool = True, alpha: float = 0.05) -> tuple[str, str]:
    """("shown" | "contradicted" | "not shown", why) for "A is better than B" from the mean of
    A - B and its (adjusted) p-value."""
    if mean is None or p_adj is None:
        return "not shown", "n<2: a t-test needs at least two units"
    if p_adj >= alpha:
        return "not shown", f"Holm p {p_adj:.3g} >= {alpha:g}"
    if mean == 0:
        return "not shown", "mean difference 0"
    favours_a = (mean > 0) == higher_is_better
    return ("shown", f"Holm p {p_adj:.3g} < {alpha:g}, mean favours A") if favours_a else \
        ("contradicted", f"Holm p {p_adj:.3g} < {alpha:g}, mean favours B")


def verdict(res: Paired, higher_is_better: bool = True) -> tuple[str, str]:
    """("shown" | "contradicted" | "not shown", why) for the claim "A is better than B"."""
    if res.n == 0:
        return "not shown", "no (order, seed) pair has both rows"
    if res.n < 2:
        return "not shown", "n=1: an interval needs at least two pairs"
    if res.p is None:
        return "not shown", NO_SPREAD_WHY
    assert res.lo is not None and res.hi is not None
    better_lo, better_hi = (res.lo, res.hi) if higher_is_better else (-res.hi, -res.lo)
    side = "above" if higher_is_better else "below"
    if better_lo > 0:
        return "shown", f"the whole interval lies {side} 0"
    if better_hi < 0:
        return "contradicted", f"the whole interval lies {'below' if higher_is_better else 'above'} 0"
    return "not shown", "the interval contains 0"
