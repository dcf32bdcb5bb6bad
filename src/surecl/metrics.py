"""Continual-learning metrics from the score matrix.

``a[i][j]`` is the score on task ``j`` after training on task ``i`` (``None`` where not
evaluated), in task ``j``'s metric: accuracy (percent) for classification, ROUGE-L or exact
match (x100) for generation, perplexity for text streams. With N tasks:

* FP (final performance)  = mean_j a[N-1][j]                       (paper, Sec. 4.1)
* AP (average performance) = mean_j a[j][j], each task right after it was learned
* forgetting = AP - FP (paper, Table "Measuring Forgetting"; negative = later tasks helped), over
  the tasks with both cells
* BWT = mean_{j<N-1} (a[N-1][j] - a[j][j])  (Lopez-Paz & Ranzato), i.e. -forgetting over
  the first N-1 tasks
* average incremental accuracy = mean_i mean_{j<=i} a[i][j]
* FWT (forward transfer, Lopez-Paz & Ranzato) = mean_{j>0} (a[j-1][j] - z[j]), where z is the
  zero-shot row (every task before any training, ``eval.before``) and a[j-1][j] the score on
  task j after training up to task j-1 (``eval.ahead``): what earlier tasks did for a task
  before it was trained; None without those cells

For a lower-is-better metric (perplexity of a text stream) the signs flip so that the names
keep their meaning: forgetting = FP - AP and BWT = mean_{j<N-1} (a[j][j] - a[N-1][j]), both
positive when earlier tasks got worse / better respectively.
"""

from __future__ import annotations

import re
import string
from statistics import fmean

Matrix = list[list[float | None]]


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return fmean(vals) if vals else None


def _columns(a: Matrix, keep: list[int] | None) -> list[int]:
    """The tasks (columns) a metric runs over: every one, or ``keep`` (the learned ones a claim keeps)."""
    if not a:
        return []
    return list(range(len(a[-1]))) if keep is None else sorted(set(keep))


def final_performance(a: Matrix, keep: list[int] | None = None) -> float | None:
    return _mean([a[-1][j] for j in _columns(a, keep)]) if a else None


def average_performance(a: Matrix, keep: list[int] | None = None) -> float | None:
    return _mean([a[j][j] for j in _columns(a, keep) if j < len(a)])


def forgetting(a: Matrix, higher_is_better: bool = True, keep: list[int] | None = None) -> float | None:
    """AP - FP over the tasks with both cells (right after learning and at the end): where a
    method leaves some unevaluated, AP and FP alone would average different tasks. With every
    cell this is the AP and FP of the summary."""
    cols = [j for j in _columns(a, keep) if j < len(a) and a[j][j] is not None and a[-1][j] is not None]
    ap, fp = average_performance(a, cols), final_performance(a, cols)
    if ap is None or fp is None:
        return None
    return ap - fp if higher_is_better else fp - ap


def backward_transfer(a: Matrix, higher_is_better: bool = True, keep: list[int] | None = None) -> float | None:
    n = len(a)
    sign = 1.0 if higher_is_better else -1.0
    diffs = [sign * (a[n - 1][j] - a[j][j]) for j in _columns(a, keep)
             if j < n - 1 and a[n - 1][j] is not None and a[j][j] is not None]
    return fmean(diffs) if diffs else None


def average_incremental_accuracy(a: Matrix, keep: list[int] | None = None) -> float | None:
    """None unless every cell on and below the diagonal was evaluated (``eval.matrix=fp_ap``
    leaves the inner cells empty, and a mean over the rest would mean something else)."""
    cols = _columns(a, keep)
    rows = [[a[i][j] for j in cols if j <= i] for i in range(len(a))]
    if any(v is None for row in rows for v in row):
        return None
    return _mean([_mean(row) for row in rows if row])


def forward_transfer(a: Matrix, initial: list[float | None] | None, higher_is_better: bool = True,
                     keep: list[int] | None = None) -> float | None:
    """Mean over the tasks j > 0 with both cells of (a[j-1][j] - initial[j]) (sign flipped for a
    lower-is-better metric, so positive = earlier tasks helped); None when no task has both."""
    if not initial:
        return None
    sign = 1.0 if higher_is_better else -1.0
    diffs = [sign * (a[j - 1][j] - initial[j]) for j in _columns(a, keep) if 1 <= j < min(len(a), len(initial))
             and a[j - 1][j] is not None and initial[j] is not None]
    return fmean(diffs) if diffs else None


def summarise(a: Matrix, higher_is_better: bool = True, initial: list[float | None] | None = None,
              keep: list[int] | None = None) -> dict[str, float | None]:
    """Every summary metric of the score matrix ``a``; with ``keep``, over those tasks (columns)
    only, on the stream's own stages (a claim leaving out tasks no row learned: FP from the last
    row, AP from each kept task's cell right after it was learned, and so on)."""
    return {
        "fp": final_performance(a, keep),
        "ap": average_performance(a, keep),
        "forgetting": forgetting(a, higher_is_better, keep),
        "bwt": backward_transfer(a, higher_is_better, keep),
        "avg_incremental": average_incremental_accuracy(a, keep),
        "fwt": forward_transfer(a, initial, higher_is_better, keep),
    }


METRIC_NAMES = {"accuracy": "accuracy (%)", "exact_match": "exact match (%)", "rouge_l": "ROUGE-L (F, x100)", "perplexity": "perplexity"}
"""How reports name each metric."""


def task_metrics(tasks, mode: str) -> dict[str, str]:
    """Each task's metric, the unit of its column of the score matrix: ``perplexity`` for every
    task under ``eval.mode=perplexity``, else the task's own (accuracy, rouge_l, exact_match,
    or perplexity for a text task)."""
    if mode == "perplexity":
        return {t.name: "perplexity" for t in tasks}
    return {t.name: t.score_metric for t in tasks}


def metric_words(metric: str, per_task: dict[str, str] | None = None) -> str:
    """A run's metric as a report says it: ``accuracy (%)``, ``ROUGE-L (F, x100)``, ... or,
    for a stream whose tasks differ (``mixed``), each task's."""
    if metric == "mixed" and per_task:
        return "each task's metric: " + ", ".join(f"{t} {METRIC_NAMES.get(m, m)}" for t, m in per_task.items())
    return METRIC_NAMES.get(metric, metric)


_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")


def normalise(text: str) -> str:
    """Exact match's normalisation of a classification answer: lower-case, first line only,
    punctuation removed, whitespace collapsed."""
    text = text.strip().split("\n", 1)[0]
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


def is_label(answer: str, gold: str, labels=()) -> bool:
    """Whether a classification answer is the gold label: the same text (first line, stripped),
    or the same after :func:`normalise` where that tells the task's ``labels`` apart. Where two
    labels normalise alike ("-1" and "1", "C++" and "C#", "Spam" and "spam") or the gold label
    normalises to nothing ("+"), only the exact text counts: an answer "1" is not the label "-1",
    and an empty answer is not "+"."""
    if answer.strip().split("\n", 1)[0].strip() == gold.strip():
        return True
    key = normalise(answer)
    if not key or key != normalise(gold):
        return False
    return sum(normalise(lab) == key for lab in labels) <= 1
