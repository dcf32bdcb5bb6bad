"""``accelerate launch --num_processes 2 --cpu`` (gloo) gives the run of one process.

Each rank trains on every second item of the mixed batch with the loss scaled so DDP's
gradient average equals the one-process gradient; surprise scoring and evaluation are sharded
and gathered, so every rank takes the same buffer decisions. What may differ is float
summation order (the gradient all-reduce, batch composition in scoring): losses and scores
are compared to 1e-4, buffer membership and the accuracy matrix exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ARGS = ["--config", "tiny,slow_surprise", "--quiet", "data.tasks=[colors,animals]", "data.n_train=48", "data.n_test=16", "train.epochs=4"]


def outcome(out: Path):
    res = json.loads((out / "results.json").read_text())
    buf = json.loads((out / "buffer.json").read_text())["entries"]
    losses = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]
    return res["accuracy_matrix"], [(e["task"], e["index"]) for e in buf], [e["score"] for e in buf], losses


def test_two_processes_match_one(tmp_path):
    env = {**os.environ, "SURECL_CACHE": str(tmp_path / "cache")}
    one = subprocess.run([sys.executable, "-m", "surecl.cli", "run", "--out", str(tmp_path / "one"), *ARGS], env=env, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    two = subprocess.run(
        [launcher, "launch", "--num_processes", "2", "--cpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
         "-m", "surecl.cli", "run", "--out", str(tmp_path / "two"), *ARGS],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    m1, members1, scores1, loss1 = outcome(tmp_path / "one")
    m2, members2, scores2, loss2 = outcome(tmp_path / "two")
    assert m1 == m2
    assert members1 == members2 and len(members1) > 0
    assert max(abs(a - b) for a, b in zip(scores1, scores2)) < 1e-4
    assert len(loss1) == len(loss2) and max(abs(a - b) for a, b in zip(loss1, loss2)) < 1e-4
    assert m1[0][0] > 0, "the run should learn something for the comparison to mean anything"
