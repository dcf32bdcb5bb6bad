"""Configuration keys as a user sets them: a config changed in Python after it was built, empty
values, decimal numbers past the whole-number cap, tokens taken as written, and eval.mode=rank
on generation tasks (surecl.config.check_again, validate, RAW_STRING_KEYS, config_warnings)."""

from __future__ import annotations

import pytest

from surecl.config import build_config, config_warnings
from surecl.data.task import Example
from surecl.errors import SureclError
from surecl.evaluate import instances
from surecl.trainer import ContinualRun

SMALL = ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=4", "train.epochs=1"]


@pytest.mark.parametrize("change, words", [
    (("dual", "beta", 1.5), r"^dual.beta: 1.5 must be a number in \(0, 1\) or auto$"),
    (("replay", "replacement", "no"), r"^replay.replacement: expected"),
    (("data", "n_test", -3), r"^data.n_test: -3 must be >= 0$"),
])
def test_a_config_changed_in_python_after_it_was_built_is_refused_before_the_run(tmp_path, tiny_cache, change, words):
    """Checked only when built, such a config ran (beta 1.5, "no" read as true) and wrote a
    config.yaml that surecl then refused to run again."""
    cfg = build_config("tiny,slow_surprise", SMALL)
    section, key, value = change
    setattr(getattr(cfg, section), key, value)
    with pytest.raises(SureclError, match=words):
        ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, key", [("model.name=", "model.name"), ("data.benchmark=", "data.benchmark"),
                                           ("data.jsonl=['']", "data.jsonl"), ("data.text_start=", "data.text_start")])
def test_an_empty_value_is_refused_by_name(override, key):
    with pytest.raises(SureclError, match=rf"^{key}: .* (is empty|holds an empty path)"):
        build_config("tiny", [override])


def test_the_whole_number_cap_binds_whole_numbers_only():
    assert build_config("tiny,ewc", ["ewc.lam=1e10"]).ewc.lam == 1e10  # an EWC strength a sweep may reach
    with pytest.raises(SureclError, match=r"^data.n_train: 2e\+09 is out of range"):
        build_config("tiny", ["data.n_train=2000000000"])
    with pytest.raises(SureclError, match=r"must be a finite number"):
        build_config("tiny,ewc", ["ewc.lam=inf"])


@pytest.mark.parametrize("token", ["[SEP]", "yes", "<|endoftext|>"])
def test_a_start_token_is_taken_as_written(token):
    assert build_config("tiny,cpt", [f"data.text_start={token}"]).data.text_start == token


def test_rank_on_generation_tasks_warns_that_they_are_generated():
    words = config_warnings(build_config("tiny", ["data.kind=generate", "eval.mode=rank"]))
    assert any(w.startswith("eval.mode=rank on generation tasks") for w in words), words
    assert not any("eval.mode" in w for w in config_warnings(build_config("tiny", ["eval.mode=rank"])))


def test_instances_take_conversations_given_as_lists():
    """A Task built in Python may give its turns as lists; eval.references=max keys on them."""
    rows = [Example("", "red", [["user", "a"], ["assistant", "red"]]), Example("", "blue", [["user", "a"], ["assistant", "blue"]]),
            Example("", "red", [["user", "b"], ["assistant", "red"]])]
    assert instances(rows) == [0, 0, 2]
