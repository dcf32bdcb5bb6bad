"""What per-task fine-tuning and multi-task learning must achieve on the tiny stream (three
class-incremental tasks, each with its own labels), not only that they run."""

from __future__ import annotations

import pytest

from surecl.config import build_config
from surecl.trainer import run

TASKS = "data.tasks=[colors,animals,numbers]"


def test_per_task_keeps_every_task_at_its_own_learned_level(tmp_path, tiny_cache):
    """Each task is evaluated with its own snapshot: every later row repeats the task's value
    from right after it was learned (a[i][j] == a[j][j], no forgetting), where the adapter
    trained last has lost the first task's labels entirely."""
    from surecl.trainer import ContinualRun

    r = ContinualRun(build_config("tiny,per_task", [TASKS]), tmp_path / "per_task", progress=False, cache_dir=tiny_cache)
    res = r.run()
    a = res["accuracy_matrix"]
    for i in range(3):
        for j in range(i + 1):
            assert a[i][j] == a[j][j], a
    diagonal = [a[j][j] for j in range(3)]
    assert sum(diagonal) / 3 >= 75.0 and min(diagonal) >= 50.0, a  # measured over seeds 0-2: means 90-100, min 70.8
    assert res["forgetting"] == 0.0 and res["bwt"] == 0.0
    # the last task's adapter answers the first task with its own labels: the snapshots matter
    assert r.evaluate_task(0, method_weights=False) <= a[2][0] - 40, a


@pytest.mark.slow
def test_mtl_learns_all_tasks_together(tmp_path, tiny_cache):
    """One stage on the union of the tasks: after it every task is answered (an untrained model
    answers none: 0 %), averaged over three seeds. Measured final rows at seeds 0-2: [100, 100, 100],
    [100, 100, 58.3], [100, 62.5, 100] on one AVX512-BF16 machine; [0, 16.7, 54.2], [100, 100,
    58.3], [100, 79.2, 54.2] on an AMD EPYC with the same flags at one thread (task means 66.7,
    65.3, 55.6; ``bench/tiny_outcomes.py --only mtl``; at two threads the same machine passed
    the earlier bounds of 75 and 60): the tiny model's joint training is as chaotic as its
    sequential training, so the bounds leave room for a seed that misses a task (of the 20
    three-seed sets from seeds 0-5 there, the lowest task mean is 36.1 and the lowest mean over tasks 51.4)."""
    rows = []
    for seed in (0, 1, 2):
        res = run(build_config("tiny,mtl", [TASKS, f"seed={seed}"]), tmp_path / f"mtl{seed}", progress=False, cache_dir=tiny_cache)
        a = res["accuracy_matrix"]
        assert a[0] == a[1] == [None, None, None], a  # no intermediate rows
        assert res["steps"] == 3 * 96 // 8 * 8  # one stage over all three tasks' examples, 8 epochs
        rows.append(a[2])
    per_task = [sum(r[j] for r in rows) / 3 for j in range(3)]
    assert sum(per_task) / 3 >= 45.0, rows  # measured 91.2 and 62.5 on the two machines above
    assert min(per_task) >= 30.0, rows  # measured 86.1 and 55.6: no task is left out


def test_mtl_with_a_dual_learner_reports_no_forgetting_for_either_adapter(tmp_path, tiny_cache):
    """MTL's one-row matrix has no forgetting to measure: AP, forgetting and BWT are None for
    the slow adapter and for the fast one (whose summary once counted the last task alone)."""
    cfg = build_config("tiny,mtl", ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=4", "train.epochs=1",
                                    "dual.enabled=true", "eval.fast=true"])
    res = run(cfg, tmp_path / "mtl", progress=False, cache_dir=tiny_cache)
    for summary in (res, res["fast"]):
        assert (summary["ap"], summary["forgetting"], summary["bwt"]) == (None, None, None), summary
        assert summary["fp"] is not None
