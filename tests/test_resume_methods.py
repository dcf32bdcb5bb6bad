"""Crash safety beyond ``slow_surprise`` without dropout (``tests/test_resume.py``): real runs of
other methods and policies are SIGKILLed at fault points (``surecl.plugins.faults``),
rerun with the same command, and must end exactly where an uninterrupted run ends: the same
accuracy matrix (and fast matrix, before-training row), FP/AP, every line of log.jsonl (loss,
lr, replayed, buffer size per step), buffer.json and the saved adapters, bit for bit.

What each case restores besides the adapters and AdamW state:

* ``slow_surprise`` with ``lora.dropout=0.1``: the torch RNG stream (dropout masks), the EMA
  accumulator and clock; killed twice (between tasks, then mid-task) before finishing.
* ``reservoir``: the reservoir's contents, ``n_seen`` and the policy's RNG (online insertion).
* ``online_surprise``: the label-quota heaps with their training-loss scores.
* ``ewc``: the Fisher and anchor (the penalty is active in task 2).
* ``per_task``: the snapshot of every finished task (evaluated after the resume).
* ``olora_replay``: O-LoRA's store of earlier tasks' LoRAs (filled when the next task starts,
  after the first kill's rerun) with a reservoir buffer beside it, and the L2 term on.
* ``nlora``: the same store under N-LoRA's L1 penalty.
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

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from safetensors.torch import load_file

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
    "ewc": ("tiny,ewc", ["ewc.lam=1e5", "ewc.samples=8"], ["step:1:3"], ["stage-0001-step-000002"]),
    "per_task": ("tiny,per_task", [], ["step:1:3"], ["stage-0001-step-000002"]),
    "olora_replay": (
        "tiny,olora", ["replay.policy=reservoir", "olora.lambda_l2=0.01"], ["stage_end:0", "step:1:3"],
        ["stage-0000-step-000002", "stage-0001-step-000002"],
    ),
    "nlora": ("tiny,nlora", ["nlora.lambda_l1=1e-5"], ["step:1:3"], ["stage-0001-step-000002"]),
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


# A process that imports surecl once and forks one child per run: each run (and each kill) is
# a separate process started from the same freshly imported state, as ``python -m surecl.cli``
# would be, without paying the ~3 s of imports (torch, transformers, peft) every time.
FORK_SERVER = r"""
import json, os, sys, traceback
import surecl.cli, surecl.trainer  # noqa: F401
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.clear()
        os.environ.update(job["env"])
        code = 1
        try:
            code = surecl.cli.main(job["argv"]) or 0
        except BaseException:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.stdout.write(json.dumps(pid) + "\n")
    sys.stdout.flush()
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
    sys.stdout.flush()
"""


RUN_TIMEOUT = 300  # seconds for one run (each takes a few)


class Runs:
    def __init__(self, root: Path):
        self.root = root
        self.server = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.n = 0

    def __call__(self, out: Path, args: list[str], kill_at: str | None = None) -> tuple[int, str]:
        """``surecl run --out out *args`` in a new process; its exit code (-9: SIGKILLed) and stderr."""
        env = {**os.environ, "SURECL_CACHE": str(self.root / "cache")}
        env.pop("SURECL_KILL_AT", None)
        env.pop("SURECL_NAN_AT", None)
        if kill_at:
            env["SURECL_KILL_AT"] = kill_at
        self.n += 1
        log = self.root / f"run{self.n}.log"
        self.server.stdin.write(json.dumps({"argv": ["run", "--out", str(out), *args], "env": env, "log": str(log)}) + "\n")
        self.server.stdin.flush()
        pid = json.loads(self.server.stdout.readline())
        done: list[str] = []
        reader = threading.Thread(target=lambda: done.append(self.server.stdout.readline()), daemon=True)
        reader.start()
        reader.join(RUN_TIMEOUT)
        if reader.is_alive():  # hung: kill it, so the server goes on, and fail
            os.kill(pid, signal.SIGKILL)
            reader.join()
            pytest.fail(f"surecl run {' '.join(args)} did not finish in {RUN_TIMEOUT} s:\n{log.read_text()[-1500:]}")
        return json.loads(done[0]), log.read_text()

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=60)


def started_from(stderr: str, out: Path, checkpoint: str | None) -> None:
    """The run resumed from ``checkpoint`` (None: there was none yet, it started over)."""
    if checkpoint is None:
        assert "resumed from" not in stderr, stderr[-800:]
    else:
        assert f"resumed from {out / 'checkpoints' / checkpoint} " in stderr, stderr[-800:]


def outcome(out: Path) -> dict:
    res = json.loads((out / "results.json").read_text())
    adapters = {}
    for name, file in (("fast", "adapter_model"), ("slow", "adapter_model"), ("prompts", "prompts")):
        f = out / "adapters" / name / f"{file}.safetensors"
        if f.is_file():
            adapters[name] = {k: v.tolist() for k, v in load_file(str(f)).items()}
    model = out / "model" / "model.safetensors"  # a full fine-tuned model (seq_ft)
    if model.is_file():
        adapters["model"] = {k: v.tolist() for k, v in load_file(str(model)).items()}
    return {
        "results": {k: res.get(k) for k in ("accuracy_matrix", "fast", "initial", "fp", "ap", "forgetting", "bwt", "steps", "buffer")},
        "log": [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()],
        "buffer": json.loads((out / "buffer.json").read_text()),
        "adapters": adapters,
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
    if case not in ("ewc", "per_task", "seq_ft", "nlora"):
        assert expected["buffer"]["entries"], "the policy should have kept entries"
    if case == "progressive_prompts":
        assert len(expected["adapters"]["prompts"]["prefix"]) == 3 * 10
    if case == "seq_ft":
        assert expected["adapters"].keys() == {"model"}
    if case == "cpt":
        assert expected["results"]["initial"] is not None and len(expected["results"]["initial"]) == 3
