"""``data.order``'s one rule (:func:`surecl.data.loading.check_order`), as a run and a sweep meet it."""

from __future__ import annotations

import dataclasses

import pytest

from surecl.config import build_config
from surecl.data.loading import ONE_ORDER, check_order
from surecl.errors import SureclError


@pytest.mark.parametrize("benchmark", sorted(ONE_ORDER))
def test_a_one_order_stream_takes_default_or_a_task_list(benchmark):
    data = build_config("tiny", [f"data.benchmark={benchmark}", "data.order=1"]).data
    with pytest.raises(SureclError) as err:
        check_order(data)
    words = str(err.value)
    assert words.startswith("data.order: ") and "has one order (default), not '1'" in words and "data.tasks" in words, words
    assert ("orders 1-6 need data.benchmark=/path/to/CL_Benchmark" in words) == (benchmark == "embedded"), words
    assert "\n" not in words
    check_order(dataclasses.replace(data, order="default"))
    check_order(dataclasses.replace(data, tasks=["a", "b"]))  # a task list makes any name an order


def test_a_benchmark_folder_has_orders_1_to_6_and_default(tmp_path):
    data = build_config("tiny", [f"data.benchmark={tmp_path / 'absent'}", "data.order=7"]).data
    with pytest.raises(SureclError, match=r"data.order: unknown order '7' \(choose from 1, 2, 3, 4, 5, 6 or default, or give"):
        check_order(data)
    for order in ("1", "6", "default"):
        check_order(dataclasses.replace(data, order=order), folder=True)  # a missing folder is the run's to say


def test_the_sweep_wording_names_its_plan(tmp_path):
    data = build_config("tiny", ["data.benchmark=tiny", "data.order=3"]).data
    with pytest.raises(SureclError, match=r"not '3'; give an order its task list in a plan$"):
        check_order(data, "give an order its task list in a plan")


def test_a_folder_is_checked_for_the_orders_tasks_only_when_asked(tmp_path):
    (tmp_path / "bench").mkdir()
    data = build_config("tiny", [f"data.benchmark={tmp_path / 'bench'}", "data.order=2"]).data
    check_order(data)  # the run's loading reads the folder once, later
    with pytest.raises(SureclError, match="holds none of the tasks order 2 names"):
        check_order(data, folder=True)
