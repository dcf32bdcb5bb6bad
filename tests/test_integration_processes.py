"""SureTrainer and SureSFTTrainer under several processes (issue 29, item 4): the same script
(tests/sure_trainer_processes.py: three tiny tasks, replay 1:2 into a buffer of 9, EMA 0.9 per
new example, checkpoints every 2 steps; a Trainer script, and a TRL one on chat rows) run by
one process and by two CPU processes (gloo, started as torch's elastic launcher starts its
workers: tests/test_two_process.py's ``launch_two``) with the same global batch; and the
Trainer script with the paper's pair loss and aging (``--pair``: ``replay_loss="pair"``,
``aging=True``, no gradient clipping).

Each optimizer step's rows (new, then replayed) are split item by item across the processes
(rank r takes r, r + 2, ...), the Trainer normalises each process's loss by the step's token
count over both and DDP averages the gradients, so a step is the one-process step; surprise
is scored on every second example per process and gathered, so both hold the same buffer; the
EMA counts the new examples of the whole step. What may differ is float summation order (the
gradient all-reduce, which rows share a batch), so the two runs are compared to tolerances
at least 40x what was measured on a 2-core x86 CPU: adapters to 5e-5 absolute (measured at most
2.1e-7 with the Trainer script, 1.0e-6 with the TRL one, over weights whose largest is about
0.15; a run whose step counts and EMA units were one process's, not the step's, ends 6.7e-3
away; 2.6e-7 with the pair loss), surprise scores and eval losses to 1e-5 relative (measured
at most 2.4e-7), each optimizer step's gradient norm after the all-reduce to 1e-4 relative
(measured at most 3.3e-7 with the pair loss, whose steps are not clipped; the other scripts
clip to norm 1, so theirs read 1.0; a pair loss missing the factor W that undoes DDP's
average fails it, its aged buffer scores too); buffer members, replay counts and the EMA
clock exactly. (With clipping, the pair script once ended with one weight of 1024 moved
7.1e-5, all others within 6.6e-7: Adam amplifies float noise on a weight whose gradient is
about 0; the pair script runs unclipped.) Between the two
processes of one run, and between a two-process run stopped mid-task and resumed and one that
was not (the Trainer script), everything is compared exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("datasets")

from safetensors.torch import load_file  # noqa: E402
from test_two_process import launch_two  # noqa: E402

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("sure_trainer_processes.py")
SRC = Path(__file__).resolve().parents[1] / "src"
TIMEOUT = 300  # seconds for a two-process run; about 40 s on 2 busy cores
TASKS, N_TRAIN = 3, 17


def environment() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), "CUDA_VISIBLE_DEVICES": ""}


def run_one(out: Path, cache: Path, *extra: str) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), str(cache), *extra], env=environment(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]


def run_two(out: Path, cache: Path, *extra: str) -> None:
    codes, log = launch_two([sys.executable, str(SCRIPT), str(out), str(cache), *extra], environment(), timeout=TIMEOUT)
    assert codes is not None, f"the two processes did not finish in {TIMEOUT} s (stuck in a collective?):\n{log}"
    assert codes == [0, 0], log


def outcome(out: Path, rank: int = 0) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((out / f"rank{rank}.json").read_text()), load_file(str(out / f"rank{rank}.safetensors"))


def members(record: dict) -> list[tuple[int, int]]:
    return [(e["task"], e["index"]) for e in record["buffer"]["entries"]]


def buffer_scores(record: dict) -> list[float]:
    return [e["score"] for e in record["buffer"]["entries"]]


def one_and_two(root: Path, cache: Path, *flags: str) -> Path:
    run_one(root / "one", cache, *flags)
    run_two(root / "two", cache, *flags)
    return root


@pytest.fixture(scope="module")
def trainer_runs(tiny_loaded, tiny_cache, tmp_path_factory):
    """The Trainer script by one process and by two."""
    return one_and_two(tmp_path_factory.mktemp("trainer"), tiny_cache)


@pytest.fixture(scope="module")
def sft_runs(tiny_loaded, tiny_cache, tmp_path_factory):
    """The TRL script (``--sft``) by one process and by two."""
    pytest.importorskip("trl")
    return one_and_two(tmp_path_factory.mktemp("sft"), tiny_cache, "--sft")


@pytest.fixture(scope="module")
def pair_runs(tiny_loaded, tiny_cache, tmp_path_factory):
    """The Trainer script with the pair loss and aging (``--pair``) by one process and by two."""
    return one_and_two(tmp_path_factory.mktemp("pair"), tiny_cache, "--pair")


@pytest.fixture(params=["trainer", "sft", "pair"])
def runs(request):
    return request.getfixturevalue(f"{request.param}_runs")


@pytest.fixture(scope="module")
def resumed(tiny_loaded, tiny_cache, tmp_path_factory):
    """The Trainer script by two processes stopped inside task 1 after its third optimizer
    step (its last checkpoint is checkpoint-2), then rerun with resume."""
    out = tmp_path_factory.mktemp("resumed")
    run_two(out, tiny_cache, "--stop", "1", "3")
    assert not (out / "rank0.json").exists(), "the stopped run should not have finished"
    run_two(out, tiny_cache, "--resume")
    return out


def test_two_processes_train_as_one(runs):
    one, one_w = outcome(runs / "one")
    two, two_w = outcome(runs / "two")
    assert one["world"] == 1 and two["world"] == 2
    # the same buffer: the same members, scores within float tolerance
    assert members(two) == members(one) and len(members(one)) == 9
    assert buffer_scores(two) == pytest.approx(buffer_scores(one), rel=1e-5, abs=0)
    for t in map(str, range(TASKS)):
        assert two["scores"][t] == pytest.approx(one["scores"][t], rel=1e-5, abs=0)
    # the same replay and EMA clock: 2 epochs of 17 new examples a task, 1:2 replayed, one
    # EMA update per new example of the whole step (not of one process's share)
    assert two["replay_counts"] == one["replay_counts"] == {str(t): [34, 17] for t in range(TASKS)}
    assert two["ema"] == one["ema"] == [0.9, 18, 102]
    # TRL's count of trained tokens leaves out the padding row a process runs without a share
    assert two["num_tokens"] == one["num_tokens"] and (one["num_tokens"] is None) == (not runs.name.startswith("sft"))
    # and so does every step's log, the one right after the padding row included
    assert two["logged_tokens"] == one["logged_tokens"] and len(one["logged_tokens"]) == 6 * TASKS
    assert (None in one["logged_tokens"]) == (not runs.name.startswith("sft"))
    # the same weights and eval losses (slow adapter on every task, fast on the current one)
    assert one_w.keys() == two_w.keys() and len(one_w) > 0
    for k in one_w:
        torch.testing.assert_close(two_w[k], one_w[k], rtol=0, atol=5e-5)
    assert torch.cat([v.flatten() for v in one_w.values()]).abs().max() > 1e-2, "the adapters should have moved"
    assert len(two["evals"]) == len(one["evals"]) == TASKS
    # the integration tears the process group down before interpreter finalisation
    # (surecl.processes), where a group left up can abort a finished process (SIGABRT)
    assert [json.loads((runs / "two" / f"exit{r}.json").read_text())["group_up"] for r in (0, 1)] == [False, False]
    for a, b in zip(two["evals"], one["evals"]):
        assert a == pytest.approx(b, rel=1e-5, abs=0)
    # every optimizer step's gradient (after the all-reduce) has the one-process step's norm
    assert len(two["grad_norms"]) == len(one["grad_norms"]) == TASKS * 6
    assert two["grad_norms"] == pytest.approx(one["grad_norms"], rel=1e-4, abs=0)
    assert one["evals"][-1][0] < 0.5 * one["evals"][0][0], "the run should learn something for the comparison to mean anything"


def test_each_process_does_its_share_and_holds_the_same_state(runs):
    one, _ = outcome(runs / "one")
    (r0, w0), (r1, w1) = outcome(runs / "two", 0), outcome(runs / "two", 1)
    # scoring sharded: rank 0 scores examples 0, 2, ..., 16 of each task, rank 1 the other 8
    assert one["scored"] == [N_TRAIN] * TASKS
    assert r0["scored"] == [(N_TRAIN + 1) // 2] * TASKS and r1["scored"] == [N_TRAIN // 2] * TASKS
    # training split by rows: the same micro-batches, each process half of every one; the
    # single-row micro-batch closing each task's first epoch leaves rank 1 a padding row
    assert r0["rows"] == [(n + 1) // 2 for n in one["rows"]]
    assert r1["rows"] == [max(1, n // 2) for n in one["rows"]] and one["rows"].count(1) == TASKS
    assert r0["padding_rows"] == 0 and r1["padding_rows"] == TASKS
    # the buffer, counts, EMA clock and weights identical on both processes, bit for bit
    for key in ("buffer", "scores", "replay_counts", "ema", "evals"):
        assert r0[key] == r1[key], key
    assert w0.keys() == w1.keys()
    for k in w0:
        assert torch.equal(w0[k], w1[k]), k
    # checkpoints and task ends written by the main process only
    assert r1["state_writes"] == [] and r0["state_writes"] == one["state_writes"]
    assert r0["state_writes"][-1] == f"run/task-{TASKS - 1}/sure-end"


def test_pair_loss_and_aging_under_two_processes(pair_runs, trainer_runs):
    """With the pair loss the two-process run is the one-process run (the runs compared above),
    and the pair loss and aging did change the run: other weights and other buffer scores than
    the default script's (the aged entries' scores are not their insertion scores)."""
    pair, pair_w = outcome(pair_runs / "one")
    joint, joint_w = outcome(trainer_runs / "one")
    assert pair["replay_counts"] == joint["replay_counts"]
    assert max(float((pair_w[k] - joint_w[k]).abs().max()) for k in pair_w) > 1e-3

    def aged(record: dict) -> list[dict]:
        inserted = {(int(t), i): s for t, scores in record["scores"].items() for i, s in enumerate(scores)}
        return [e for e in record["buffer"]["entries"] if e["score"] != inserted[(e["task"], e["index"])]]

    assert aged(pair) and not aged(joint)


def test_two_processes_resume_as_an_uninterrupted_run(trainer_runs, resumed):
    """Resuming is SureTrainer's code path, shared by SureSFTTrainer: checked on the Trainer script."""
    for rank in (0, 1):
        ref, ref_w = outcome(trainer_runs / "two", rank)
        res, res_w = outcome(resumed, rank)
        assert res["resumed_from"] == "run/task-1/checkpoint-2"
        assert res["buffer"] == ref["buffer"] and res["replay_counts"] == ref["replay_counts"] and res["ema"] == ref["ema"]
        assert res["evals"] == ref["evals"][1:]  # tasks 1 and 2, trained by the resumed run
        for k in ref_w:
            assert torch.equal(res_w[k], ref_w[k]), k


def test_a_later_task_of_a_resuming_script_waits_for_the_main_processs_task_end(tiny_loaded, tiny_cache, tmp_path):
    """A script passing resume_from_checkpoint=True at every task looks for a resume point again
    at each later task. The main process chooses it, after it wrote the last task's end: the
    other process used to look on its own, before that write, took the task's newest mid-task
    checkpoint and, saved with save_only_model, refused alone while the main process went on
    into a collective (a gloo traceback)."""
    run_two(tmp_path / "two", tiny_cache, "--resume", "--save-only", "--slow-end", "3", "--no-eval")
    for rank in (0, 1):
        record, _ = outcome(tmp_path / "two", rank)
        assert record["resumed_from"] is None and sorted(record["replay_counts"]) == [str(t) for t in range(TASKS)]  # every task trained
        assert record["state_writes"][-1] == f"run/task-{TASKS - 1}/sure-end" if rank == 0 else "sure-end" not in str(record["state_writes"])
