"""The outputs review's findings: predictions.jsonl names each row by its position in the task's
test set as evaluated (identical inputs, and rows the sampling reordered, could not be joined
back to the data), and ``Task.as_text`` on a task given a bad row after construction is one line
(an AttributeError traceback)."""

from __future__ import annotations

import json

import pytest

from surecl.config import build_config
from surecl.data.loading import load_stream
from surecl.data.task import Example, Task
from surecl.errors import SureclError
from surecl.trainer import ContinualRun


def test_predictions_join_back_to_their_test_rows_by_index(tmp_path, tiny_cache):
    """A user's file whose test rows repeat inputs (one input with both labels, as noisy data
    has): each prediction's ``index`` is its row in the sampled test set, the run's
    ``tasks[j].test`` and what ``load_stream`` of the run's config.yaml draws again; input and
    gold of every line are that row's, each row once. A join by input is ambiguous here."""
    rows = [{"task": "mine", "instruction": "Which class fits the cue word in the text? ", "labels": ["warm", "cool"]}]
    rows += [{"sentence": f"the {'red' if i % 2 else 'blue'}", "label": "warm" if i % 2 else "cool", "split": "train"} for i in range(8)]
    test = [("the red", "warm"), ("the blue", "cool"), ("the red", "warm"), ("the red", "cool"), ("the blue", "cool"),
            ("the red", "warm"), ("the blue", "warm"), ("the blue", "cool")]
    rows += [{"sentence": s, "label": y, "split": "test"} for s, y in test]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    cfg = build_config("tiny,seq_lora", ["data.benchmark=none", f"data.jsonl=[{path}]", "data.n_test=6", "train.epochs=1"])
    run = ContinualRun(cfg, out, progress=False, cache_dir=tiny_cache)
    run.run()
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    [task] = run.tasks
    assert len(task.test) == 6 and [(ex.sentence, ex.label) for ex in task.test] != test[:6]  # sampled: fewer rows, reordered
    assert sorted(p["index"] for p in preds) == list(range(6))
    assert len({(p["input"], p["gold"]) for p in preds}) < len(preds) and len({p["input"] for p in preds}) == 2
    [again] = load_stream(build_config(str(out / "config.yaml")))
    for p in preds:
        assert p["task"] == "mine" and isinstance(p["index"], int)
        for ex in (task.test[p["index"]], again.test[p["index"]]):
            assert (ex.sentence, ex.label) == (p["input"], p["gold"])
    # the fields that were there are as they were, index beside them
    assert list(preds[0]) == ["task", "index", "input", "prediction", "gold", "correct"]


def test_as_text_of_a_task_given_a_bad_row_after_construction_is_one_line():
    """``task.train.append(Example(None, ...))`` passes no construction check; ``as_text`` (a
    continual pre-training domain made of a task) read ``None.strip()``: a traceback."""
    good = [Example("hot", "up"), Example("cold", "down")]
    task = Task("a", "x ", ["up", "down"], list(good), list(good))
    task.train.append(Example(None, "up"))
    with pytest.raises(SureclError) as err:
        task.as_text()
    assert str(err.value) == "task a train row 2: sentence is None, not text"
    chat = Task("c", "", [], list(good), list(good), kind="generate")
    chat.test.append(Example("hi", "yo", [("assistant", 3)]))
    with pytest.raises(SureclError, match=r"^task c test row 2: messages must be \(role, content\) pairs of strings"):
        chat.as_text()
    assert [ex.sentence for ex in Task("d", "x ", ["up", "down"], list(good), list(good)).as_text().train] == ["hot", "cold"]
