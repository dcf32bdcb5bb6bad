"""A resume reads the data its checkpoint was written on: each task's sampled rows are
fingerprinted in every checkpoint, and a resume on other rows stops in one line naming the task
(``--fresh`` starts over); options that change no result may change on resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surecl import trainer
from surecl.cli import main

LABELS = ["warm", "cool"]  # words of the tiny tokenizer: labels it reads as unknown stop a run


def write_task(path: Path, name: str, flip: int | None = None) -> Path:
    rows = [{"task": name, "instruction": "Which fruit? ", "labels": LABELS}]
    for i in range(12):
        label = LABELS[(i + (1 if i == flip else 0)) % 2]
        rows.append({"sentence": f"{name} {i}", "label": label, "split": "test" if i >= 8 else "train"})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def interrupted(tmp_path, monkeypatch):
    """A run of two jsonl tasks stopped (Ctrl-C) after its first task's checkpoint."""
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    a, b = write_task(tmp_path / "fruit.jsonl", "fruit"), write_task(tmp_path / "veg.jsonl", "veg")
    argv = ["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(tmp_path / "run"), "data.benchmark=none",
            f"data.jsonl=[{a},{b}]", "train.epochs=1"]
    real = trainer.ContinualRun.run_stage

    def stop_at_second(self, s):
        if s == 1:
            raise KeyboardInterrupt
        return real(self, s)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer.ContinualRun, "run_stage", stop_at_second)
        assert main(argv) == 130
    assert (tmp_path / "run" / "checkpoints" / "stage-0001").is_dir()
    return tmp_path, argv


def test_a_resume_on_changed_data_stops_naming_the_task(interrupted, capsys):
    root, argv = interrupted
    write_task(root / "fruit.jsonl", "fruit", flip=3)  # one training row relabelled at the same path
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("surecl: error: "), err
    assert "task fruit" in err[0] and "--fresh" in err[0]
    assert not (root / "run" / "results.json").exists()
    assert main([*argv, "--fresh"]) == 0  # the documented way to start over on the new data


def test_options_that_change_no_result_may_change_on_resume(interrupted, capsys):
    _, argv = interrupted
    capsys.readouterr()
    assert main([*argv, "train.keep_checkpoints=1", "log_every=2"]) == 0
    assert "resumed from" in capsys.readouterr().err
    # and a finished run is the same run under them
    assert main([*argv, "train.keep_checkpoints=3"]) == 0
    assert "already finished" in capsys.readouterr().err


def test_a_finished_run_on_changed_data_is_not_nothing_to_do(interrupted, capsys):
    """A finished run whose data was edited since: the rerun says so in one line (``--fresh``
    trains it again), instead of "already finished" over results of the old rows."""
    root, argv = interrupted
    assert main(argv) == 0  # finishes the run
    before = (root / "run" / "results.json").read_bytes()
    write_task(root / "veg.jsonl", "veg", flip=9)  # one test row relabelled at the same path
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "task veg" in err[0] and "--fresh" in err[0] and "already finished" not in err[0], err
    assert (root / "run" / "results.json").read_bytes() == before
    write_task(root / "veg.jsonl", "veg")  # the data as it was: finished again
    assert main(argv) == 0 and "already finished" in capsys.readouterr().err
