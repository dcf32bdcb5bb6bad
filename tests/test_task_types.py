"""A Task or Example built in Python with a field of the wrong type (a pandas missing value, a
number where text was meant, None, a bare string for a list) is one SureclError line naming the
task, split and row: it was a traceback from deep inside a run (unicodedata, the tokenizer,
``list(None)``), where ``Task.from_hf`` and the file readers already check their input."""

from __future__ import annotations

import pytest

from surecl.config import build_config
from surecl.data.loading import caller_stream
from surecl.data.task import Example, Task
from surecl.errors import SureclError

GOOD = [Example("hot", "up"), Example("cold", "down")]
LABELS = ["up", "down"]


def one_line(build) -> str:
    """The message of the SureclError ``build()`` raises, checked to be one line."""
    with pytest.raises(SureclError) as err:
        build()
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(("build", "says"), [
    (lambda: Task("a", "x ", LABELS, [Example(float("nan"), "up"), *GOOD], GOOD), "task a train row 0: sentence is float nan, not text"),
    (lambda: Task("a", "x ", LABELS, GOOD, [GOOD[0], Example(None, "up")]), "task a test row 1: sentence is None, not text"),
    (lambda: Task("a", "x ", LABELS, [GOOD[0], Example("hot", 1)], GOOD), "task a train row 1: label is int 1, not text"),
    (lambda: Task("a", "", [], [Example("hot", 1)], GOOD, kind="generate"), "task a train row 0: label is int 1, not text"),
    (lambda: Task(5, "x ", LABELS, GOOD, GOOD), "task name must be a string, not int 5"),
    (lambda: Task("a", None, LABELS, GOOD, GOOD), "task a: instruction must be a string, not None"),
    (lambda: Task("a", "x ", LABELS, ["hot up"], GOOD), "task a train row 0: str 'hot up' is not an Example"),
    (lambda: Task("a", "x ", LABELS, None, GOOD), "task a: train must be a list of Example, not None"),
    (lambda: Task("a", "x ", LABELS, GOOD, "hot up"), "task a: test must be a list of Example, not str 'hot up'"),
    (lambda: Task("a", "x ", None, GOOD, GOOD), "task a: labels must be a list of strings, not None"),
    (lambda: Task("a", "x ", "updown", GOOD, GOOD), "task a: labels must be a list of strings, not str 'updown'"),
    (lambda: Task("a", "x ", ["up", 2], GOOD, GOOD), "task a: labels must be a list of strings; item 1 is int 2"),
    (lambda: Task("a", "x ", LABELS, GOOD, GOOD, group=None), "task a: group must be a string, not None"),
    (lambda: Task("a", "x ", LABELS, GOOD, GOOD, meta=None), "task a: meta must be a dict, not None"),
    (lambda: Task("a", "", [], [Example("hi", "yo", ({"role": "assistant", "content": "yo"},))], GOOD, kind="generate"),
     "task a train row 0: messages must be (role, content) pairs of strings"),
], ids=["nan sentence", "None sentence", "int label", "generate int target", "int name", "None instruction", "str row",
        "None train", "str test", "None labels", "str labels", "int in labels", "None group", "None meta", "dict turns"])
def test_a_wrong_typed_field_is_one_line_naming_task_split_and_row(build, says):
    assert one_line(build).startswith(says)


def test_a_field_assigned_after_construction_is_refused_by_check_and_by_a_run():
    """A Task is mutable: a bad row assigned later is refused by ``check`` and by the run's copy
    of the tasks (``caller_stream``, which ``ContinualRun(tasks=)`` reads), not a traceback."""
    task = Task("a", "x ", LABELS, list(GOOD), list(GOOD))
    task.train = [Example(float("nan"), "up"), *GOOD]
    assert one_line(task.check).startswith("task a train row 0: sentence is float nan, not text")
    cfg = build_config("tiny,seq_lora", ["data.n_train=0", "data.n_test=0"])
    assert one_line(lambda: caller_stream([task], cfg)).startswith("tasks: task a train row 0: sentence is float nan, not text")
    task.train = ["hot up"]
    assert one_line(lambda: caller_stream([task], cfg)).startswith("tasks: task a train row 0: str 'hot up' is not an Example")
    task.train, task.labels = list(GOOD), None  # read by the run's copy before any check: a TypeError there
    assert one_line(lambda: caller_stream([task], cfg)).startswith("tasks: task a: labels must be a list of strings, not None")


def test_what_was_valid_stays_valid():
    """Tuples for the label set and the splits, list turns in a conversation, a decomposed name
    (read composed) and a missing-value-free stream run as before."""
    task = Task("e\u0301te\u0301", "x ", ("up", "down"), tuple(GOOD), tuple(GOOD))
    task.check()
    assert task.name == "\u00e9t\u00e9"
    chat = Example("hi", "yo", [["user", "hi"], ["assistant", "yo"]])
    Task("c", "", [], [chat], [chat], kind="generate").check()
    cfg = build_config("tiny,seq_lora", ["data.n_train=0", "data.n_test=0"])
    [got] = caller_stream([task], cfg)
    assert sorted(ex.label for ex in got.train) == ["down", "up"]
