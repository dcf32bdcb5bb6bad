"""Continual-learning metrics from the accuracy matrix.

``a[i][j]`` is the accuracy (percent) on task ``j`` after training on task ``i`` (``None``
where not evaluated). With N tasks:

* FP (final performance)  = mean_j a[N-1][j]                       (paper, Sec. 4.1)
* AP (average performance) = mean_j a[j][j], each task right after it was learned
* forgetting = AP - FP (paper, Table "Measuring Forgetting"; negative = later tasks helped)
* BWT = mean_{j<N-1} (a[N-1][j] - a[j][j])  (Lopez-Paz & Ranzato), i.e. -forgetting over
  the first N-1 tasks
* average incremental accuracy = mean_i mean_{j<=i} a[i][j]
"""

from __future__ import annotations

from statistics import fmean

Matrix = list[list[float | None]]


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return fmean(vals) if vals else None


def final_performance(a: Matrix) -> float | None:
    return _mean(a[-1]) if a else None


def average_performance(a: Matrix) -> float | None:
    return _mean([a[j][j] for j in range(len(a))])


def forgetting(a: Matrix) -> float | None:
    ap, fp = average_performance(a), final_performance(a)
    return None if ap is None or fp is None else ap - fp


def backward_transfer(a: Matrix) -> float | None:
    n = len(a)
    diffs = [a[n - 1][j] - a[j][j] for j in range(n - 1) if a[n - 1][j] is not None and a[j][j] is not None]
    return fmean(diffs) if diffs else None


def average_incremental_accuracy(a: Matrix) -> float | None:
    rows = [_mean(a[i][: i + 1]) for i in range(len(a))]
    return _mean(rows)


def summarise(a: Matrix) -> dict[str, float | None]:
    return {
        "fp": final_performance(a),
        "ap": average_performance(a),
        "forgetting": forgetting(a),
        "bwt": backward_transfer(a),
        "avg_incremental": average_incremental_accuracy(a),
    }
