"""The claims' statistics in surecl.stats against hand computations: the two-sided paired t-test
p-value, the exact sign test, Holm's step-down adjustment and the verdict from an adjusted p."""

from __future__ import annotations

import math

import pytest

from surecl.stats import NO_SPREAD_WHY, holm, p_verdict, paired, sign_test, t_test_p, verdict


def test_t_test_p_known_values():
    assert t_test_p(2.0, 10) == pytest.approx(0.0734, abs=5e-5)  # tables: two-sided p of t = 2 on 10 df
    assert t_test_p(-2.0, 10) == t_test_p(2.0, 10)
    assert t_test_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)  # Cauchy: 1 - 2 atan(1) / pi
    assert t_test_p(2.776445, 4) == pytest.approx(0.05, abs=1e-6)  # t_{0.975, 4}
    assert t_test_p(0.0, 5) == pytest.approx(1.0)
    assert t_test_p(math.inf, 3) == 0.0


def test_paired_carries_t_and_p():
    res = paired([1.0, 2.0, 3.0, 4.0])  # mean 2.5, sd sqrt(5/3), t = 2.5 / (sd / 2) = 3.873 on 3 df
    assert res.t_stat == pytest.approx(2.5 / (math.sqrt(5 / 3) / 2))
    assert res.p == pytest.approx(t_test_p(res.t_stat, 3))
    assert res.p == pytest.approx(0.030466, abs=1e-5)
    assert paired([3.0]).p is None and paired([]).p is None
    # no spread: the t statistic would be infinite and p 0 with two units; no t-test instead
    same = paired([2.0, 2.0, 2.0])
    assert (same.t_stat, same.p, same.mean) == (None, None, 2.0)
    assert paired([0.5, 0.5]).p is None and paired([0.0, 0.0]).p is None
    assert paired([0.1 + 0.2, 0.3]).p is None  # equal but for float rounding
    assert verdict(paired([0.5, 0.5])) == ("not shown", NO_SPREAD_WHY)


def test_sign_test_matches_the_binomial():
    # 8 wins, 2 losses, 1 tie dropped: 2 * P(X <= 2), X ~ Bin(10, 1/2) = 2 * (1 + 10 + 45) / 1024
    res = sign_test([1.0] * 8 + [-0.5] * 2 + [0.0])
    assert (res.wins, res.losses, res.ties) == (8, 2, 1)
    assert res.p == pytest.approx(2 * 56 / 1024)
    assert sign_test([1.0, 2.0, 3.0]).p == pytest.approx(0.25)  # 2 * (1/2)^3
    assert sign_test([1.0, -1.0]).p == 1.0  # 2 * 3/4, capped at 1
    assert sign_test([0.0, 0.0]).p == 1.0 and sign_test([]).p == 1.0
    # symmetric in wins and losses
    assert sign_test([-1.0] * 9 + [1.0]).p == pytest.approx(2 * 11 / 1024)


def test_holm_hand_computed():
    # sorted 0.01, 0.03, 0.04: 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; 1 x 0.04 = 0.04 -> max(0.06, 0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.4]) == pytest.approx([0.8, 0.8])  # capped at 1, then monotone
    assert holm([0.6, 0.01]) == pytest.approx([0.6, 0.02])
    assert holm([0.9, 0.8, 0.7]) == pytest.approx([1.0, 1.0, 1.0])  # 3 x 0.7 capped at 1
    assert holm([0.02]) == [0.02]
    assert holm([]) == []
    # an untested claim (None) stays None and is not counted in the family
    assert holm([0.01, None, 0.04]) == [pytest.approx(0.02), None, pytest.approx(0.04)]
    with pytest.raises(ValueError):
        holm([1.5])


def test_p_verdict_uses_the_adjusted_p_and_the_direction():
    assert p_verdict(2.0, 0.01)[0] == "shown"
    assert p_verdict(-2.0, 0.01)[0] == "contradicted"
    assert p_verdict(-2.0, 0.01, higher_is_better=False)[0] == "shown"  # lower is better: A below B
    assert p_verdict(2.0, 0.06) == ("not shown", "Holm p 0.06 >= 0.05")
    assert p_verdict(2.0, 0.05)[0] == "not shown"  # p < alpha, strictly
    assert p_verdict(None, None)[0] == "not shown"
