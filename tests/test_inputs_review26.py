"""Inputs review 26: what a caller in Python may pass that the CLI never does (a preset string
for the config, an empty or file output path, plugins or a cache that are no such thing, a dict
for SureTrainer's ``sure``) is one line before anything is written; a classification label
holding a line break is refused (an answer is scored on its first line);
a UTF-16 JSONL file and a generation file read as a classification one say what they are."""

from __future__ import annotations

import json

import pytest

from surecl.config import build_config
from surecl.data.jsonl import load_jsonl_task
from surecl.data.task import Example, Task
from surecl.errors import SureclError
from surecl.plugins.base import Plugin
from surecl.trainer import ContinualRun, run

SMALL = ["train.epochs=1", "data.tasks=[colors]", "data.n_train=8", "data.n_test=4"]


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("entry", ["run", "ContinualRun"])
@pytest.mark.parametrize("case, words", [
    ("config as a preset string", ["cfg: expected a RunConfig", "build_config('tiny,seq_lora')"]),
    ("out_dir a file", ["out_dir:", "is a file, not a directory"]),
    ("out_dir empty", ["out_dir: empty", "unset shell variable"]),
    ("out_dir None", ["out_dir: expected a folder path", "None"]),
    ("plugins not a list", ["plugins: expected a list of Plugin", "int 3"]),
    ("plugins item not a Plugin", ["plugins: item 0", "not a Plugin"]),
    ("cache_dir a file", ["cache_dir:", "is a file, not a directory"]),
    ("log_with one text", ["log_with: expected a list of tracker names", "str 'tensorboard'"]),
])
def test_library_entry_refuses_in_one_line_before_writing(entry, case, words, tmp_path, tiny_cache, monkeypatch):
    """Each was a raw TypeError / FileExistsError / NotADirectoryError, and an empty out_dir
    trained into the current folder (config.yaml, results.json, checkpoints/ there)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "afile").write_text("x")
    cfg = build_config("tiny,seq_lora", SMALL)
    kw = {"progress": False, "cache_dir": tiny_cache}
    out = work / "out"
    if case == "config as a preset string":
        cfg = "tiny,seq_lora"
    elif case == "out_dir a file":
        out = "afile"
    elif case == "out_dir empty":
        out = ""
    elif case == "out_dir None":
        out = None
    elif case == "plugins not a list":
        kw["plugins"] = 3
    elif case == "plugins item not a Plugin":
        kw["plugins"] = [object()]
    elif case == "cache_dir a file":
        kw["cache_dir"] = "afile"
    elif case == "log_with one text":
        kw["log_with"] = "tensorboard"
    with pytest.raises(SureclError) as err:
        if entry == "run":
            run(cfg, out, **kw)
        else:
            ContinualRun(cfg, out, **kw).run()
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)
    assert _files(work) == ["afile"] and (work / "afile").read_text() == "x"


def test_library_entry_takes_plugins_as_a_tuple_and_a_fresh_cache_folder(tmp_path, tiny_cache):
    """The checks leave what was accepted accepted: a tuple of Plugin instances, a cache folder
    not made yet (the model is built into it), an output path given as a str."""
    class Seen(Plugin):
        name = "seen"

        def __init__(self):
            self.steps = 0

        def after_step(self, ctx, record):
            self.steps += 1

    seen = Seen()
    results = run(build_config("tiny,seq_lora", SMALL), str(tmp_path / "out"), progress=False, cache_dir=tiny_cache, plugins=(seen,))
    assert results["tasks"] == ["colors"] and seen.steps > 0 and (tmp_path / "out" / "results.json").is_file()


def test_sure_trainer_refuses_a_dict_for_sure(tmp_path, fresh_tiny):
    """A dict failed as AttributeError "'dict' object has no attribute 'check'"."""
    from transformers import TrainingArguments

    from surecl.integrations.transformers import SureTrainer

    args = TrainingArguments(str(tmp_path / "out"), report_to=[], use_cpu=True)
    grads = [p.requires_grad for p in fresh_tiny.parameters()]
    with pytest.raises(SureclError, match=r"sure= must be a SureArguments, not dict; build one: sure=SureArguments\(") as err:
        SureTrainer(model=fresh_tiny, args=args, sure={"buffer_size": 3})
    assert "\n" not in str(err.value)
    assert [p.requires_grad for p in fresh_tiny.parameters()] == grads and not (tmp_path / "out").exists()


def _task(labels, train_labels, test_labels=None, kind="classify"):
    return Task("t", "Pick.", labels, [Example(f"s{i}", y) for i, y in enumerate(train_labels)],
                [Example(f"q{i}", y) for i, y in enumerate(test_labels or train_labels)], kind=kind)


@pytest.mark.parametrize("bad", ["yes\nA", "a\r\nb"])
def test_classification_label_with_a_line_break_is_refused(bad):
    """Generate-mode scoring compares an answer's first line: with labels "yes\\nA" and "yes\\nB"
    a perfect answer scored 0, and with "yes\\nA" and "no" an answer "yes\\nB" counted as "yes\\nA"."""
    task = _task([bad, "no"], ["no", bad])
    with pytest.raises(SureclError) as err:
        task.check("f.jsonl")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"f.jsonl: task t train row 1: label {bad!r} holds a line break; write each label on one line"), message


@pytest.mark.parametrize("odd", ["a\x00b", "a\rb", "a\tb", "a\u2028b", "a\x85b", "a\x7fb"])
def test_a_label_with_another_control_character_is_kept_and_scored_as_written(odd):
    """Only a line break splits the line an answer is scored on; these stay labels as before."""
    from surecl.metrics import is_label

    _task([odd, "no"], ["no", odd]).check()
    assert is_label(odd + "\nmore", odd, [odd, "no"]) and not is_label("no", odd, [odd, "no"])


def test_a_label_list_entry_no_row_holds_is_named_by_its_place():
    with pytest.raises(SureclError, match=r"task t: label 1 of its labels, 'b\\nc', holds a line break"):
        _task(["a", "b\nc"], ["a", "a"]).check()


def test_clean_labels_and_generation_targets_with_line_breaks_still_pass():
    _task(["yes A", "no", "caf\u00e9"], ["yes A", "no", "caf\u00e9"]).check()
    generation = _task([], ["line one\nline two", "a\tb"], kind="generate")
    generation.check()
    assert generation.train[0].label == "line one\nline two"


def test_jsonl_file_with_multiline_labels_is_refused_naming_file_task_split_row(tmp_path):
    path = tmp_path / "nl.jsonl"
    rows = [{"sentence": f"s{i}", "label": ["yes\nA", "yes\nB"][i % 2], "split": "train" if i < 8 else "test"} for i in range(12)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SureclError, match=r"nl\.jsonl: task nl train row 0: label 'yes\\nA' holds a line break"):
        load_jsonl_task(path)


def test_dry_run_refuses_multiline_labels(tmp_path, capsys, monkeypatch):
    """The reviewer's case: such a file passed --dry-run on the default config."""
    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "nl.jsonl"
    rows = [{"sentence": f"s{i}", "label": ["yes\nA", "no"][i % 2], "split": "train" if i < 8 else "test"} for i in range(12)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code = main(["run", "--dry-run", "--config", "tiny,seq_lora", "data.benchmark=none", f"data.jsonl=[{path}]", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "holds a line break" in err[0], err


ROWS = "\n".join(json.dumps({"sentence": f"s{i}", "label": "ab"[i % 2], "split": "train" if i < 4 else "test"}) for i in range(6)) + "\n"


@pytest.mark.parametrize("encoding, named", [
    ("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32"), ("utf-32-le", "UTF-32"),
])
def test_utf16_and_utf32_files_say_so(tmp_path, encoding, named):
    """They said "not UTF-8 (byte 0)" (with a byte-order mark) or "line 1: malformed JSON" (without)."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(ROWS.encode(encoding))
    with pytest.raises(SureclError) as err:
        load_jsonl_task(path)
    assert str(err.value) == f"{path}: looks like {named}, not UTF-8: save it as UTF-8"


def test_utf8_files_read_as_before_and_other_bytes_are_not_called_utf16(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(ROWS.encode("utf-8-sig"))  # a UTF-8 byte-order mark is dropped, as before
    assert load_jsonl_task(path).labels == ["a", "b"]
    path.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03abc")  # gzip: NULs, but not as UTF-16 writes text
    with pytest.raises(SureclError, match=r"not UTF-8 \(byte 1\)"):
        load_jsonl_task(path)


@pytest.mark.parametrize("row", [{"prompt": "p", "response": "r"}, {"instruction": "i", "output": "o"},
                                 {"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}])
def test_generation_file_read_as_classification_says_how_to_read_it(tmp_path, row):
    path = tmp_path / "gen.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "split": "test"}) + "\n")
    with pytest.raises(SureclError) as err:
        load_jsonl_task(path)
    assert str(err.value) == (f"{path} line 1: missing 'sentence' (a generation row: read the file with data.kind=generate, "
                              "or give it a header line {\"kind\": \"generate\"})")
    assert load_jsonl_task(path, kind="generate").kind == "generate"
