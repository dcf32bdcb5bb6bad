"""A new user's first day: what trips someone who brings their own labels, model, tasks and
datasets, or takes an exported adapter elsewhere (issue 30, item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import surecl
from surecl.cli import main
from surecl.data.task import Example, Task
from surecl.errors import SureclError


def write_jsonl(path: Path, labels: list[str], name: str = "mine") -> Path:
    rows = [{"task": name, "instruction": "Which class fits the cue word in the text? ", "labels": labels}]
    rows += [{"sentence": f"the {['red', 'blue'][i % 2]}", "label": labels[i % 2], "split": "test" if i >= 8 else "train"} for i in range(12)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# ----------------------------------------------------------------------------- (a) labels


@pytest.mark.parametrize(
    "labels, words",
    [
        (["yes", "no"], ["task mine", "'yes', 'no'", "unknown or no tokens"]),  # not in the tiny vocabulary: all <unk>
        (["red x1", "red x2"], ["task mine", "'red x1' = 'red x2'", "same token ids"]),  # both "red <unk>"
        (["warm", "warm "], ["'warm' = 'warm '", "same token ids"]),  # the same word after pre-tokenisation
    ],
)
def test_labels_the_tokenizer_cannot_tell_apart_stop_in_one_line(labels, words, tmp_path, tiny_cache, monkeypatch, capsys):
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    path = write_jsonl(tmp_path / "mine.jsonl", labels)
    out = tmp_path / "run"
    code = main(["run", "--quiet", "--config", "tiny,seq_lora", "data.benchmark=none", f"data.jsonl=[{path}]", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]
    assert not (out / "checkpoints").exists() and not (out / "log.jsonl").exists()  # stopped before training


def test_labels_check_in_the_python_api(tmp_path, tiny_cache):
    rows = [Example("the red", "hot"), Example("the blue", "cold")] * 4
    task = Task("temps", "Which? ", ["hot", "cold"], rows, rows)
    cfg = surecl.build_config("tiny,seq_lora", [])
    with pytest.raises(SureclError, match=r"task temps: .*'hot', 'cold'.* unknown"):
        surecl.ContinualRun(cfg, tmp_path / "r", progress=False, cache_dir=tiny_cache, tasks=[task])


def test_labels_of_the_tiny_stream_pass_the_check(tiny_loaded):
    from surecl.data.encode import TaskEncoder
    from surecl.data.tiny import tiny_stream

    encoder = TaskEncoder(tiny_loaded.tokenizer, 64)
    assert all(encoder.check_labels(t) == [] for t in tiny_stream())
