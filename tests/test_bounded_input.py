"""Hostile or careless input stays bounded: YAML alias bombs stop at once, error messages stay
short, every number is finite and in range before any work, damaged checkpoints are said so."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest

from surecl import trainer
from surecl.cli import main
from surecl.config import build_config
from surecl.errors import SureclError

LEVELS = 6  # 9**6 = 531441 values from 6 short lines: over the bound, small enough for an unbounded loader to survive


def alias_bomb(levels: int = LEVELS) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for k in range(1, levels):
        lines.append(f"a{k}: &a{k} [" + ",".join([f"*a{k - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_stops_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(9))  # 342 bytes, 387 million values expanded
    build_config("tiny")  # the method registry loaded first: only the bomb is timed and traced
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(SureclError, match="aliases expand to more than"):
            build_config(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 1.0 and peak < 100 * 2**20


def test_alias_bombs_in_plans_and_overrides_are_one_line(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    path.write_text(alias_bomb())
    assert main(["sweep", "--plan", str(path), "--out", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "aliases expand to more than" in err[0], err
    flat = alias_bomb().replace("\n", ", ")
    with pytest.raises(SureclError, match="aliases expand to more than"):
        build_config("tiny", ["data.tasks={" + flat + "}"])


def test_an_error_message_renders_a_few_hundred_characters_of_a_value(tmp_path, capsys):
    assert main(["run", "--config", "tiny", "--out", str(tmp_path / "run"), "data.tasks=[" + "x/" * 5000 + "]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("surecl: error: data.tasks") and len(err[0]) <= 700, (len(err[0]), err[0][:100])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, words", [
    ("train.grad_clip=inf", ["train.grad_clip", "finite"]),
    ("train.lr=.nan", ["train.lr"]),
    ("train.epochs=1e12", ["train.epochs", "1 to 1000"]),
    ("data.n_train=1e30", ["data.n_train"]),
    ("train.max_steps_per_task=99999999999999", ["train.max_steps_per_task", "out of range"]),
    ("dual.window_tasks=1e400", ["dual.window_tasks"]),
])
def test_every_number_is_finite_and_in_range_before_any_work(tmp_path, capsys, override, words):
    start = time.perf_counter()
    assert main(["run", "--config", "tiny", "--out", str(tmp_path / "run"), "train.max_steps_per_task=2", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("surecl: error: "), err
    assert all(w in err[0] for w in words), err[0]
    assert time.perf_counter() - start < 5 and not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- damaged checkpoints


@pytest.fixture
def interrupted(tmp_path, monkeypatch):
    """A tiny run stopped (Ctrl-C) after its second task's checkpoint."""
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    argv = ["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(tmp_path / "run"),
            "data.tasks=[colors,animals,numbers]", "data.n_train=8", "data.n_test=4", "train.epochs=1"]
    real = trainer.ContinualRun.run_stage

    def stop(self, s):
        if s == 2:
            raise KeyboardInterrupt
        return real(self, s)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer.ContinualRun, "run_stage", stop)
        assert main(argv) == 130
    ck = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["stage-0001", "stage-0002"]
    return ck, argv


def test_a_malformed_meta_json_falls_back_to_the_previous_checkpoint(interrupted, capsys):
    ck, argv = interrupted
    meta = json.loads((ck / "stage-0002" / "meta.json").read_text())
    del meta["config"]  # parses, checksum right, not a checkpoint's meta
    (ck / "stage-0002" / "meta.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "checkpoint stage-0002 is incomplete or corrupt" in err and "resumed from" in err and "stage-0001" in err
    assert "Traceback" not in err


def test_all_corrupt_checkpoints_are_said_so_before_starting_over(interrupted, capsys):
    ck, argv = interrupted
    for folder in ck.iterdir():
        (folder / "tensors.safetensors").write_bytes(b"garbage")
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "no checkpoint in" in err and "starting over from the beginning" in err and "resumed from" not in err
    assert (Path(ck).parent / "results.json").is_file()
