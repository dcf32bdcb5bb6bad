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


def test_a_window_past_float_precision_is_refused():
    """dual.window_tasks=1e17 with beta auto rounded beta to 1: the bias-corrected EMA divided
    by 0 and the slow adapter answered with NaN weights (FP 0), no error."""
    from surecl.adapters import resolve_beta

    dual = build_config("tiny,slow_surprise", ["dual.beta=auto", "dual.window_tasks=1e17"]).dual
    with pytest.raises(SureclError, match=r"^dual.window_tasks: 1e\+17 tasks of 30 updates is a window past float precision"):
        resolve_beta(dual, 30)
    assert 0 < resolve_beta(build_config("tiny,slow_surprise", ["dual.beta=auto", "dual.window_tasks=1e9"]).dual, 30) < 1


@pytest.mark.parametrize("written, token", [("'s", "'s"), ('Ġ"', 'Ġ"'), ("<s>'", "<s>'"), ('"', '"'), ("'[SEP]'", "[SEP]"), ('"yes"', "yes")])
def test_a_start_token_keeps_its_quote_characters_but_one_surrounding_pair(written, token):
    assert build_config("tiny,cpt", [f"data.text_start={written}"]).data.text_start == token


def test_a_yaml_token_read_as_a_list_says_to_quote_it(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("kind: setting\ndata:\n  text_start: [SEP]\n")
    with pytest.raises(SureclError, match=r"data.text_start: expected a string, got \['SEP'\] .*quote it, e.g. '\[SEP\]'"):
        build_config(f"tiny,cpt,{preset}")


def test_rank_on_generation_tasks_from_a_file_warns_too(tmp_path):
    from surecl.config import stream_warnings
    from surecl.data.task import Task

    cfg = build_config("tiny,seq_lora", ["eval.mode=rank"])
    generate = Task("gen", "", [], [Example("a", "b")], [Example("a", "b")], kind="generate")
    assert any(w.startswith("eval.mode=rank on generation tasks") for w in stream_warnings(cfg, [generate]))
    assert stream_warnings(cfg, [Task("c", "", ["x"], [Example("a", "x")], [Example("a", "x")])]) == []
