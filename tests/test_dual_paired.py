"""Paired evaluation of the dual learner: a dual run evaluates its fast adapter beside the slow
one, and that fast adapter is trained exactly as the same method without the dual learner."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from surecl.config import build_config
from surecl.trainer import run

FAST = ["train.epochs=6", "data.n_train=48", "data.n_test=16", "data.tasks=[colors,animals]", "lora.dropout=0.1"]


@pytest.mark.parametrize(("dual", "single"), [("slow_surprise", "surprise"), ("slow_reservoir", "reservoir")])
def test_fast_matrix_of_a_dual_run_equals_the_non_dual_run(dual, single, tmp_path, tiny_cache):
    # dropout 0.1: the dual learner must not shift the random stream the fast adapter's masks come from
    d = run(build_config(f"tiny,{dual}", FAST), tmp_path / "dual", progress=False, cache_dir=tiny_cache)
    s = run(build_config(f"tiny,{single}", FAST), tmp_path / "single", progress=False, cache_dir=tiny_cache)
    assert "fast" not in s
    assert d["fast"]["accuracy_matrix"] == s["accuracy_matrix"]
    assert d["fast"]["fp"] == s["fp"] and d["fast"]["forgetting"] == s["forgetting"]
    # the slow adapter is another set of weights (its answers may still coincide on this tiny stream)
    fast_w, slow_w = (load_file(str(tmp_path / "dual" / "adapters" / a / "adapter_model.safetensors")) for a in ("fast", "slow"))
    assert fast_w.keys() == slow_w.keys() and any(not torch.equal(fast_w[k], slow_w[k]) for k in fast_w)
    # and the training losses (the fast trajectory) are the same step for step
    loss = lambda p: [json.loads(line)["loss"] for line in (p / "log.jsonl").read_text().splitlines()]  # noqa: E731
    assert loss(tmp_path / "dual") == loss(tmp_path / "single")
    report = (tmp_path / "dual" / "report.md").read_text()
    assert "Fast adapter" in report


def test_fast_evaluation_can_be_turned_off_and_resumes(tmp_path, tiny_cache):
    off = run(build_config("tiny,slow_surprise", FAST + ["eval.fast=false"]), tmp_path / "off", progress=False, cache_dir=tiny_cache)
    assert "fast" not in off
    # killed between tasks and resumed: the fast matrix survives the checkpoint
    import os
    import subprocess
    import sys

    out = tmp_path / "resumed"
    cmd = [sys.executable, "-m", "surecl.cli", "run", "--quiet", "--config", "tiny,slow_surprise", "--out", str(out), *FAST]
    env = {**os.environ, "SURECL_KILL_AT": "stage_end:0", "SURECL_CACHE": str(tiny_cache)}
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == -9
    env.pop("SURECL_KILL_AT")
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    whole = run(build_config("tiny,slow_surprise", FAST), tmp_path / "whole", progress=False, cache_dir=tiny_cache)
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["fast"]["accuracy_matrix"] == whole["fast"]["accuracy_matrix"]
    assert resumed["accuracy_matrix"] == whole["accuracy_matrix"]


def test_per_task_has_no_fast_rows(tmp_path, tiny_cache):
    res = run(build_config("tiny,per_task", FAST + ["dual.enabled=true"]), tmp_path / "pt", progress=False, cache_dir=tiny_cache)
    assert "fast" not in res


def test_beta_auto_sets_beta_from_the_steps_per_task(tmp_path, tiny_cache, capsys):
    from surecl.adapters import resolve_beta
    from surecl.cli import main
    from surecl.config import DualConfig

    assert resolve_beta(DualConfig(beta=0.995), 15) == 0.995
    assert resolve_beta(DualConfig(beta=0.995, window_tasks=2), 15) == 0.995  # a number: the window is not read
    assert resolve_beta(DualConfig(beta="auto", window_tasks=2), 15) == pytest.approx(1 - 1 / 30)
    assert resolve_beta(DualConfig(beta="auto"), 16) == pytest.approx(1 - 1 / 8)  # half a task by default
    assert resolve_beta(DualConfig(beta="auto", window_tasks=0.01), 15) == 0.0  # a window below one step is one step
    # 48 examples at batch 8, 6 epochs: 36 steps per task; a window of 2 tasks is 72 steps
    res = run(build_config("tiny,slow_surprise", FAST + ["dual.beta=auto", "dual.window_tasks=2"]), tmp_path / "w", progress=False, cache_dir=tiny_cache)
    assert res["dual_beta"] == pytest.approx(1 - 1 / 72) and res["config"]["dual"]["beta"] == "auto"
    # the EMA really ran at that rate: the fast trajectory is the non-dual one, the slow one differs from beta 0.9's
    other = run(build_config("tiny,slow_surprise", FAST + ["dual.window_tasks=2"]), tmp_path / "b", progress=False, cache_dir=tiny_cache)
    assert other["dual_beta"] == 0.9 and res["fast"]["accuracy_matrix"] == other["fast"]["accuracy_matrix"]
    slow = [load_file(str(d / "adapters" / "slow" / "adapter_model.safetensors")) for d in (tmp_path / "w", tmp_path / "b")]
    assert any(not torch.equal(slow[0][k], slow[1][k]) for k in slow[0])
    # the run report and the slow adapter's model card name the rate auto resolved to
    assert "beta auto: 0.9861, a window of 2.0 tasks" in (tmp_path / "w" / "report.md").read_text()
    assert "beta 0.9861, from dual.beta=auto" in (tmp_path / "w" / "adapters" / "slow" / "README.md").read_text()
    assert main(["run", "--dry-run", "--config", "tiny,slow_surprise", "dual.beta=auto", "dual.window_tasks=2", *FAST]) == 0
    assert "beta 0.9861 (auto: a window of 2 tasks)" in capsys.readouterr().out
