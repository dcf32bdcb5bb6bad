"""What two processes must agree on, and what they must not share.

Agree: a method's fresh adapter at a task's start (``per_task``, O-LoRA draw it from the run's
seed and the task, not from a stream the processes' dropout masks have moved on), the
checkpoint a resumed run restores (only the main process's manifest knows which ones the run
wrote), and a refusal the main process alone can see (the others stop with its one line instead
of waiting in a collective). Not share: dropout masks (each process draws its own rows' masks)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_two_process import TWO_PROCESS_TIMEOUT, launch_two

from surecl.methods.ilora.method import ILoRA

PROBE = str(Path(__file__).with_name("process_probe.py"))
BASE = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", "train.epochs=1"]


def _env(tmp_path: Path, **extra) -> dict:
    env = {**os.environ, "SURECL_CACHE": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": "", "PROBE_DIR": str(tmp_path), **extra}
    env.pop("SURECL_KILL_AT", None)
    return env


def _ranks(tmp_path: Path) -> list[dict]:
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["per_task", "olora"])
def test_a_fresh_adapter_per_task_is_the_same_on_both_processes(method, tmp_path):
    codes, out = launch_two([sys.executable, PROBE, str(tmp_path / "run"), f"tiny,{method}", *BASE, "lora.dropout=0.1"],
                            _env(tmp_path), TWO_PROCESS_TIMEOUT)
    assert codes == [0, 0], out
    one, two = _ranks(tmp_path)
    assert len(one["before"]) == 2 and one["before"] == two["before"] and one["end"] == two["end"], (one, two)
    assert one["before"][1] != one["end"][0]  # task 2 started from a fresh adapter
    # each process draws its own rows' dropout masks: none of the first masks is shared
    assert len(one["masks"]) == len(two["masks"]) == 8 and not set(one["masks"]) & set(two["masks"])


@pytest.mark.slow
def test_a_checkpoint_the_manifest_does_not_list_is_resumed_by_neither_process(tmp_path):
    """A user's copy of a checkpoint folder in a run folder whose manifest lists none: the main
    process starts over, and so must the other (it resumed from the copy, the two then paired
    different collectives and failed with tracebacks)."""
    env = _env(tmp_path)
    args = ["tiny,seq_lora", *BASE]
    codes, out = launch_two([sys.executable, PROBE, str(tmp_path / "a"), *args], env, TWO_PROCESS_TIMEOUT)
    assert codes == [0, 0], out
    first = _ranks(tmp_path)
    (tmp_path / "b" / "checkpoints").mkdir(parents=True)
    (tmp_path / "b" / ".surecl-manifest.json").write_text('{"paths": [], "dirs": []}')
    copied = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir() if p.name.startswith("stage-"))[-1]
    shutil.copytree(tmp_path / "a" / "checkpoints" / copied, tmp_path / "b" / "checkpoints" / "stage-0009")  # a name the run never writes
    codes, out = launch_two([sys.executable, PROBE, str(tmp_path / "b"), *args], env, TWO_PROCESS_TIMEOUT)
    assert codes == [0, 0], out
    assert "Traceback" not in out and "resumed from" not in out, out
    again = _ranks(tmp_path)
    assert again[0]["end"] == again[1]["end"] == first[0]["end"]  # both trained both tasks from the start
    assert json.loads((tmp_path / "b" / "results.json").read_text())["accuracy_matrix"] == \
        json.loads((tmp_path / "a" / "results.json").read_text())["accuracy_matrix"]


@pytest.mark.slow
def test_a_refusal_only_the_main_process_sees_stops_both_with_its_line(tmp_path):
    """Through the Python API (the command line checks on every process first): a user's
    results.json where the run writes is refused by the main process, and the other process
    stops with the same line rather than going on into scoring and failing there."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text('{"mine": true}')
    codes, out = launch_two([sys.executable, PROBE, str(tmp_path / "run"), "tiny,slow_surprise", *BASE],
                            _env(tmp_path, PROBE_API="1"), TWO_PROCESS_TIMEOUT)
    assert codes == [2, 2], out
    assert "Traceback" not in out and out.count("was not written by surecl") == 2, out
    assert (tmp_path / "run" / "results.json").read_text() == '{"mine": true}'


def test_ilora_term_weighs_every_row_as_one_process_does(monkeypatch):
    """Each process adds its rows' mean; DDP averages the processes' gradients. Scaled by the
    process's share of the step's rows, the average is the one-process mean for any split
    (3 replayed rows over 2 processes: 2 and 1), and a process without rows adds nothing."""
    method = ILoRA()
    method.config.rows = "replayed"
    monkeypatch.setattr(ILoRA, "consistency", lambda self, ctx, items: torch.tensor(float(sum(i for _, i in items)) / len(items)))

    def total(world: int, n: int) -> float:
        rows = [(0, k) for k in range(8)] + [(1, 10 + k) for k in range(n)]  # 8 new rows, n replayed
        out = []
        for rank in range(world):
            ctx = SimpleNamespace(step_items=rows, step_new=8, rank=rank, world=world)
            out.append(float(method.loss(ctx, torch.tensor(0.0))))
        return sum(out) / world  # DDP's average

    for n in (1, 2, 3, 5):
        assert total(2, n) == pytest.approx(total(1, n)), n
        assert total(3, n) == pytest.approx(total(1, n)), n
