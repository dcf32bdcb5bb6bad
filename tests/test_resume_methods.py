"""Crash safety beyond ``slow_surprise`` without dropout (``tests/test_resume.py``) and beyond the
method contract (``tests/test_method_contract.py``, which kills every registered method once at
its defaults): real runs of policies, and of methods in richer settings, are SIGKILLed at fault points (``surecl.plugins.faults``),
rerun with the same command, and must end exactly where an uninterrupted run ends: the same
accuracy matrix (and fast matrix, before-training row), FP/AP, every line of log.jsonl (loss,
lr, replayed, buffer size per step), buffer.json and the saved adapters, bit for bit.

What each case restores besides the adapters and AdamW state:

* ``slow_surprise`` with ``lora.dropout=0.1``: the torch RNG stream (dropout masks), the EMA
  accumulator and clock; killed twice (between tasks, then mid-task) before finishing.
* ``reservoir``: the reservoir's contents, ``n_seen`` and the policy's RNG (online insertion).
* ``online_surprise``: the label-quota heaps with their training-loss scores.
* ``olora_replay``: O-LoRA's store of earlier tasks' LoRAs (filled when the next task starts,
  after the first kill's rerun) with a reservoir buffer beside it, and the L2 term on.
* ``surprise_aging``: the buffer's order after replayed entries were re-scored in place (a
  restored buffer that re-ranked them would replay other examples after the resume).
* ``cpt``: the before-training row (killed while writing its checkpoint) and a text stream.
* ``progressive_prompts`` (with its MLP and reservoir replay): the frozen prompts, the prompt
  and MLP being trained, their AdamW state; killed right after a new prompt was drawn (the
  resumed run draws it again from the restored RNG), then mid-task. The exported prompts
  (``adapters/prompts``) are compared too.
* ``seq_ft``: every base weight and its AdamW moments (full fine-tuning; one checkpoint kept,
  ``train.keep_checkpoints=1``), killed between tasks and mid-task; the exported ``model/``.
"""

from __future__ import annotations

import pytest
from fork_runs import Runs, outcome, started_from

COMMON = [
    "--quiet", "data.tasks=[colors,animals,numbers]", "data.n_train=16", "data.n_test=8",
    "train.epochs=2", "train.checkpoint_every=2",
]
# 16 examples / batch 8 x 2 epochs = 4 steps per task: step:1:3 is task 2's last step, after
# the mid-task checkpoint taken at step 2 (stage-0001-step-000002).
CASES = {
    # name: (config, extra overrides, kill points in order, the checkpoint the run after each
    # kill starts from: None where the kill came before the first checkpoint was complete)
    "slow_surprise_dropout": (
        "tiny,slow_surprise", ["lora.dropout=0.1"], ["stage_end:0", "step:1:3"], ["stage-0000-step-000002", "stage-0001-step-000002"],
    ),
    "reservoir": ("tiny,reservoir", [], ["step:1:3"], ["stage-0001-step-000002"]),
    "online_surprise": ("tiny,online_surprise", [], ["step:1:3"], ["stage-0001-step-000002"]),
    "olora_replay": (
        "tiny,olora", ["replay.policy=reservoir", "olora.lambda_l2=0.01"], ["stage_end:0", "step:1:3"],
        ["stage-0000-step-000002", "stage-0001-step-000002"],
    ),
    "surprise_aging": ("tiny,surprise_aging", [], ["step:2:3"], ["stage-0002-step-000002"]),
    "cpt": ("tiny,cpt,slow_surprise", [], ["checkpoint:stage-0000", "step:1:3"], [None, "stage-0001-step-000002"]),
    "progressive_prompts": (
        "tiny,progressive_prompts", ["prompts.mlp=true", "prompts.mlp_hidden=16", "replay.policy=reservoir"],
        ["step:1:0", "step:1:3"], ["stage-0001", "stage-0001-step-000002"],
    ),
    "seq_ft": (
        "tiny,seq_ft", ["train.lr=1e-3", "train.keep_checkpoints=1"], ["stage_end:0", "step:1:3"],
        ["stage-0000-step-000002", "stage-0001-step-000002"],
    ),
}


@pytest.fixture(scope="module")
def surecl(tmp_path_factory):
    runs = Runs(tmp_path_factory.mktemp("resume_methods"))
    yield runs
    runs.close()


@pytest.mark.parametrize("case", list(CASES))
def test_killed_run_resumes_to_the_uninterrupted_result(case, surecl):
    config, extra, points, starts = CASES[case]
    args = ["--config", config, *COMMON, *extra]
    rc, err = surecl(surecl.root / f"{case}-full", args)
    assert rc == 0, err[-2000:]
    expected = outcome(surecl.root / f"{case}-full")
    out = surecl.root / f"{case}-killed"
    for k, point in enumerate(points):
        rc, err = surecl(out, args, kill_at=point)
        assert rc == -9, f"the run was not killed at {point}: {rc} {err[-800:]}"
        assert not (out / "results.json").exists()
        if k > 0:  # this run followed the previous kill before being killed again
            started_from(err, out, starts[k - 1])
    rc, err = surecl(out, args)
    assert rc == 0, err[-2000:]
    started_from(err, out, starts[-1])
    got = outcome(out)
    assert got["results"] == expected["results"]
    assert got["log"] == expected["log"]  # every step's loss, lr, replayed count and buffer size
    assert got["buffer"] == expected["buffer"]
    assert got["adapters"] == expected["adapters"]
    # the comparison means something: the run trained, and replay runs kept a buffer
    first_task = [line["loss"] for line in expected["log"] if line["stage"] == 0]
    assert len(expected["log"]) == 12 and first_task[-1] < first_task[0]
    if case != "seq_ft":
        assert expected["buffer"]["entries"], "the policy should have kept entries"
    if case == "progressive_prompts":
        assert len(expected["adapters"]["prompts"]["prefix"]) == 3 * 10
    if case == "seq_ft":
        assert expected["adapters"].keys() == {"model"}
    if case == "cpt":
        assert expected["results"]["initial"] is not None and len(expected["results"]["initial"]) == 3
