"""accelerate's mixed precision (``accelerate launch --mixed_precision bf16``, its config file,
``ACCELERATE_MIXED_PRECISION``) wrapped a run's forwards in autocast while results.json recorded
the base's dtype: a ``model.dtype=fp32`` run trained and scored in bf16 and said float32. A run
now sets ``mixed_precision="no"`` and says so; a process whose accelerate state already holds
another setting is one line."""

from __future__ import annotations

import logging

import pytest
from accelerate import Accelerator
from accelerate.state import AcceleratorState

from surecl.config import build_config
from surecl.errors import SureclError
from surecl.trainer import run

RUN = ["data.tasks=[colors]", "train.epochs=1", "eval.mode=rank", "model.dtype=fp32"]


@pytest.fixture
def fresh_state():
    """A process whose accelerate state is not set yet, as at the start of ``surecl run``."""
    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)



def test_accelerates_mixed_precision_does_not_change_a_run(fresh_state, tmp_path, tiny_cache, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="surecl")
    cfg = build_config("tiny,surprise", RUN)
    plain = run(cfg, tmp_path / "plain", progress=False, cache_dir=tiny_cache)
    AcceleratorState._reset_state(True)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    asked = run(cfg, tmp_path / "asked", progress=False, cache_dir=tiny_cache)
    assert AcceleratorState().mixed_precision == "no"
    assert asked["accuracy_matrix"] == plain["accuracy_matrix"] and asked["initial"] == plain["initial"]
    losses = [(tmp_path / name / "log.jsonl").read_text() for name in ("plain", "asked")]
    assert [line for line in losses[1].splitlines() if '"loss"' in line] == [line for line in losses[0].splitlines() if '"loss"' in line]
    notes = [r.getMessage() for r in caplog.records if r.name == "surecl" and "mixed_precision=bf16 is not used" in r.getMessage()]
    assert len(notes) == 1 and "model.dtype" in notes[0] and "\n" not in notes[0]


def test_a_process_already_set_to_mixed_precision_is_one_line(fresh_state, tmp_path, tiny_cache):
    Accelerator(cpu=True, mixed_precision="bf16")
    with pytest.raises(SureclError, match=r"already set mixed_precision=bf16.*in a process of its own") as err:
        run(build_config("tiny,surprise", RUN), tmp_path / "out", progress=False, cache_dir=tiny_cache)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out" / "results.json").exists()
