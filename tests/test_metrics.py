"""Continual-learning metrics from the accuracy matrix, against hand-computed values."""

from __future__ import annotations

import pytest

from surecl.metrics import (
    average_incremental_accuracy,
    average_performance,
    backward_transfer,
    final_performance,
    forgetting,
    summarise,
)

# a[i][j]: accuracy on task j after training on task i (sequential run: upper cells unevaluated)
LOWER = [
    [80.0, None, None],
    [70.0, 90.0, None],
    [60.0, 75.0, 85.0],
]
FP = (60 + 75 + 85) / 3  # mean of the last row
AP = (80 + 90 + 85) / 3  # mean of the diagonal
BWT = ((60 - 80) + (75 - 90)) / 2  # last row minus diagonal, first N-1 tasks
AVG_INC = (80 + (70 + 90) / 2 + (60 + 75 + 85) / 3) / 3  # mean over rows of the seen tasks' mean


def test_summarise_3x3_by_hand():
    s = summarise(LOWER)
    assert set(s) == {"fp", "ap", "forgetting", "bwt", "avg_incremental", "fwt"}
    assert s["fwt"] is None  # no zero-shot row given
    assert s["fp"] == pytest.approx(FP)
    assert s["ap"] == pytest.approx(AP)
    assert s["forgetting"] == pytest.approx(AP - FP)
    assert s["bwt"] == pytest.approx(BWT)
    assert s["avg_incremental"] == pytest.approx(AVG_INC)
    # sanity of the hand numbers themselves
    assert s["fp"] == pytest.approx(73.3333333)
    assert s["bwt"] == pytest.approx(-17.5)


def test_individual_functions_agree_with_summarise():
    s = summarise(LOWER)
    assert final_performance(LOWER) == s["fp"]
    assert average_performance(LOWER) == s["ap"]
    assert forgetting(LOWER) == s["forgetting"]
    assert backward_transfer(LOWER) == s["bwt"]
    assert average_incremental_accuracy(LOWER) == s["avg_incremental"]


def test_forgetting_relates_to_bwt_on_a_full_matrix():
    # AP - FP = mean_j (a[j][j] - a[N-1][j]); the last term is 0, so = -(N-1)/N * BWT
    s = summarise(LOWER)
    assert s["forgetting"] == pytest.approx(-(2 / 3) * s["bwt"])


def test_upper_triangle_does_not_enter_incremental_accuracy():
    full = [
        [80.0, 10.0, 20.0],
        [70.0, 90.0, 30.0],
        [60.0, 75.0, 85.0],
    ]
    s = summarise(full)
    assert s["avg_incremental"] == pytest.approx(AVG_INC)
    assert s["fp"] == pytest.approx(FP) and s["ap"] == pytest.approx(AP) and s["bwt"] == pytest.approx(BWT)


def test_negative_forgetting_when_later_tasks_help():
    a = [[40.0, None], [60.0, 50.0]]
    s = summarise(a)
    assert s["fp"] == pytest.approx(55.0)  # (60 + 50) / 2
    assert s["ap"] == pytest.approx(45.0)  # (40 + 50) / 2
    assert s["forgetting"] == pytest.approx(-10.0)
    assert s["bwt"] == pytest.approx(20.0)  # 60 - 40


def test_none_cells_are_skipped():
    a = [[50.0, None], [None, 70.0]]  # task 0 not re-evaluated at the end
    s = summarise(a)
    assert s["fp"] == pytest.approx(70.0)
    assert s["ap"] == pytest.approx(60.0)
    # forgetting pairs each task's two cells: task 0 has no final one, so only task 1 counts
    # (AP - FP over unpaired cells would read -10, "later tasks helped", from a missing cell)
    assert s["forgetting"] == pytest.approx(0.0)
    assert s["bwt"] is None  # no pair with both cells
    # average incremental accuracy needs every cell on and below the diagonal (a mean over the
    # cells present would be another quantity, e.g. with eval.matrix=fp_ap)
    assert s["avg_incremental"] is None
    assert summarise([[50.0, None], [40.0, 70.0]])["avg_incremental"] == pytest.approx(52.5)  # mean(50, mean(40, 70))


def test_forgetting_over_tasks_with_both_cells():
    # a method's own evaluation left task 1's diagonal cell out and task 2's final cell out
    a = [
        [80.0, None, None],
        [70.0, None, None],
        [60.0, 75.0, None],
    ]
    a[2][2] = None
    a[1][1] = None
    assert forgetting(a) == pytest.approx(80.0 - 60.0)  # only task 0 has both cells
    assert forgetting(a, higher_is_better=False) == pytest.approx(60.0 - 80.0)
    assert forgetting(a, keep=[1, 2]) is None  # no kept task has both
    full = [[80.0, None], [70.0, 90.0]]
    assert forgetting(full) == pytest.approx(average_performance(full) - final_performance(full))


def test_all_none_matrix():
    s = summarise([[None, None], [None, None]])
    assert s == {"fp": None, "ap": None, "forgetting": None, "bwt": None, "avg_incremental": None, "fwt": None}


def test_one_by_one():
    s = summarise([[42.5]])
    assert s["fp"] == s["ap"] == s["avg_incremental"] == pytest.approx(42.5)
    assert s["forgetting"] == pytest.approx(0.0)
    assert s["bwt"] is None  # no earlier task


def test_empty_matrix():
    assert summarise([]) == {"fp": None, "ap": None, "forgetting": None, "bwt": None, "avg_incremental": None, "fwt": None}
