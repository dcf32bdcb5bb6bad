"""Crash safety: a real run is SIGKILLed at several points, rerun, and must end exactly where an
uninterrupted run with the same seed ends (CPU, deterministic)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from surecl.checkpoint import LOCK, lock_holder

pytestmark = pytest.mark.slow  # every test here runs surecl two or three times as a subprocess (16-23 s each)

ARGS = [
    "--config", "tiny,slow_surprise", "--quiet",
    "data.tasks=[colors,animals,numbers]", "data.n_train=24", "data.n_test=8",
    "train.epochs=2", "train.checkpoint_every=2",
]
# (kill point, what is happening there)
POINTS = [
    ("score:1", "while scoring surprise before task 2"),
    ("step:1:3", "in the middle of task 2, after a mid-task checkpoint"),
    ("stage_end:0", "between tasks: task 1 evaluated, its checkpoint not yet written"),
    ("checkpoint:stage-0002", "while writing the checkpoint after task 2"),
]


def surecl(out: Path, cache: Path, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SURECL_CACHE": str(cache)}
    env.pop("SURECL_KILL_AT", None)
    if kill_at:
        env["SURECL_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "surecl.cli", "run", "--out", str(out), *ARGS], env=env, capture_output=True, text=True)


def outcome(out: Path) -> dict:
    res = json.loads((out / "results.json").read_text())
    losses = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]
    return {
        "accuracy_matrix": res["accuracy_matrix"], "fp": res["fp"], "ap": res["ap"], "steps": res["steps"],
        "buffer": json.loads((out / "buffer.json").read_text()), "losses": losses,
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    done = surecl(root / "full", root / "cache")
    assert done.returncode == 0, done.stderr
    return root, outcome(root / "full")


@pytest.mark.parametrize("point", [p for p, _ in POINTS], ids=[p for p, _ in POINTS])
def test_killed_run_resumes_to_the_same_result(point, reference):
    root, expected = reference
    out = root / point.replace(":", "_")
    killed = surecl(out, root / "cache", kill_at=point)
    assert killed.returncode == -9, f"the run was not killed at {point}: {killed.returncode} {killed.stderr[-500:]}"
    assert not (out / "results.json").exists()
    assert (out / LOCK).is_file() and lock_holder(out) is None  # the killed process's lock file, released
    resumed = surecl(out, root / "cache")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    assert outcome(out) == expected
    assert lock_holder(out) is None
    # the wall time of every finished part counts, not only the resumed one's
    t = json.loads((out / "results.json").read_text())["timing"]
    assert t["total"] >= t["train"] + t["score"] + t["eval"], t


def test_corrupt_checkpoint_falls_back_to_previous(reference):
    root, expected = reference
    out = root / "corrupt"
    killed = surecl(out, root / "cache", kill_at="stage_end:2")
    assert killed.returncode == -9
    newest = sorted((out / "checkpoints").iterdir())[-1]
    (newest / "tensors.safetensors").write_bytes(b"garbage")
    resumed = surecl(out, root / "cache")
    assert resumed.returncode == 0, resumed.stderr
    assert f"checkpoint {newest.name} is incomplete or corrupt" in resumed.stderr
    assert outcome(out) == expected


def test_nan_loss_stops_cleanly_and_the_run_resumes(reference):
    root, expected = reference
    out = root / "nan"
    env = {**os.environ, "SURECL_CACHE": str(root / "cache"), "SURECL_NAN_AT": "1:5"}
    bad = subprocess.run([sys.executable, "-m", "surecl.cli", "run", "--out", str(out), *ARGS], env=env, capture_output=True, text=True)
    assert bad.returncode == 2
    assert "non-finite loss" in bad.stderr and "Traceback" not in bad.stderr
    assert not (out / "results.json").exists()
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept[-1] == "stage-0001-step-000004", kept
    resumed = surecl(out, root / "cache")
    assert resumed.returncode == 0, resumed.stderr
    assert outcome(out) == expected
