"""kill -9 during a user's Trainer script with SuRe, then the same script rerun with
``next_task(..., resume_from_checkpoint=True)``: it ends where an uninterrupted run ends.

The test writes a small user-like script (``SureTrainer`` on the tiny model, three tasks,
LoRA dropout on, a Trainer checkpoint every 2 steps) and runs it as separate processes. A
kill point in ``$SURE_KILL`` makes the script SIGKILL itself:

* ``end:<t>``: right after task t's ``next_task`` returned (its ``sure-end`` state written);
* ``save:<t>:<step>``: inside the Trainer's checkpoint-<step> of task t, after the weights and
  optimizer were written and before its RNG states and ``trainer_state.json`` (a folder the
  Trainer would list as its last checkpoint, but incomplete: the resume must pass over it);
* ``step:<t>:<step>``: after optimizer step <step> of task t (past a complete checkpoint).

One folder is killed at each point in turn, each rerun continuing from the previous kill; the
last rerun finishes. The final fast and slow adapters (bit for bit), buffer (entries and
scores), replay counts, EMA clock and the slow adapter's evaluation losses must equal the
uninterrupted run's, and each rerun must have resumed from the checkpoint expected of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

pytest.importorskip("datasets")

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 300  # seconds per process; each takes ~10 s on 2 busy cores

SCRIPT = r'''
"""A user's Trainer script with SuRe, plus the test's kill points ($SURE_KILL)."""
import json
import os
import signal
import sys
from pathlib import Path

import datasets
import torch
from safetensors.torch import save_file
from transformers import DataCollatorForLanguageModeling, TrainerCallback, TrainingArguments

from surecl.config import ModelConfig
from surecl.data.tiny import tiny_stream
from surecl.integrations.transformers import SureArguments, SureTrainer
from surecl.model import load_model

out, cache = Path(sys.argv[1]), Path(sys.argv[2])
kind, *where = (os.environ.get("SURE_KILL") or "none").split(":")
where = [int(x) for x in where]


def die():
    os.kill(os.getpid(), signal.SIGKILL)


loaded = load_model(ModelConfig(name="tiny"), torch.device("cpu"), cache)
tok = loaded.tokenizer


def encode(rows):
    ds = datasets.Dataset.from_dict({"text": [f"{e.sentence} Answer: {e.label}" for e in rows]})
    return ds.map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])


stream = tiny_stream(n_train=24, n_test=8)[:3]
args = TrainingArguments(
    str(out), per_device_train_batch_size=8, learning_rate=5e-3, num_train_epochs=2, save_strategy="steps", save_steps=2,
    seed=0, report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no",
)
sure = SureArguments(buffer_size=9, ratio="1:2", unit="example", beta=0.9, lora_dropout=0.1)
trainer = SureTrainer(model=loaded.model, args=args, data_collator=DataCollatorForLanguageModeling(tok, mlm=False), sure=sure)


class KillAtStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if kind == "step" and [trainer.task, state.global_step] == where:
            die()


trainer.add_callback(KillAtStep())
save_rng_state = trainer._save_rng_state


def killing_save_rng_state(output_dir):
    if kind == "save" and [trainer.task, trainer.state.global_step] == where:
        die()
    return save_rng_state(output_dir)


trainer._save_rng_state = killing_save_rng_state
for t, task in enumerate(stream):
    trainer.next_task(encode(task.train), resume_from_checkpoint=True)
    print("resumed_from", trainer.resumed_from, flush=True)
    if kind == "end" and where == [t]:
        die()

_, tensors = trainer.dual.state_dict()
save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "final.safetensors"))
result = {
    "buffer": trainer.policy.buffer.state_dict(),
    "replay_counts": trainer.replay_counts,
    "ema": [trainer.dual.steps, trainer.dual.updates],
    "eval_loss": [trainer.evaluate(encode(task.test))["eval_loss"] for task in stream],
    "eval_loss_fast": [trainer.evaluate(encode(task.test), adapter="fast")["eval_loss"] for task in stream],
}
(out / "result.json").write_text(json.dumps(result))
'''


def run_script(script, out, cache, kill: str | None):
    env = {**os.environ}
    env.pop("SURE_KILL", None)
    if kill:
        env["SURE_KILL"] = kill
    proc = subprocess.run([sys.executable, str(script), str(out), str(cache)], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    return proc.returncode, proc.stderr, resumed_from(proc.stdout)


def resumed_from(stdout: str) -> str | None:
    """The checkpoint the script's trainer continued from (its last ``resumed_from`` line naming one)."""
    named = [line.split(" ", 1)[1] for line in stdout.splitlines() if line.startswith("resumed_from ")]
    named = [x for x in named if x != "None"]
    return named[-1] if named else None


def outcome(out):
    result = json.loads((out / "result.json").read_text())
    return result, load_file(str(out / "final.safetensors"))


def test_killed_trainer_script_resumes_to_the_uninterrupted_result(tiny_loaded, tiny_cache, tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(SCRIPT)
    rc, err, start = run_script(script, tmp_path / "full", tiny_cache, None)
    assert rc == 0, err[-3000:]
    assert start is None
    expected, expected_tensors = outcome(tmp_path / "full")

    out = tmp_path / "killed"
    # each kill point, and the checkpoint the run after it must continue from: a task's end, the
    # complete checkpoint before the interrupted save, the last complete one inside a task
    points = [("end:0", "task-0/sure-end"), ("save:1:4", "task-1/checkpoint-2"), ("step:2:3", "task-2/checkpoint-2")]
    previous = None
    for kill, then in points:
        rc, err, start = run_script(script, out, tiny_cache, kill)
        assert rc == -9, f"the script was not killed at {kill}: {rc} {err[-2000:]}"
        assert not (out / "result.json").exists()
        assert start == previous, (kill, start)
        previous = str(out / then)
        if kill.startswith("save"):  # the killed save left a folder the Trainer would call its last checkpoint
            assert (out / "task-1" / "checkpoint-4" / "sure_state.json").is_file()
            assert not (out / "task-1" / "checkpoint-4" / "trainer_state.json").exists()
    rc, err, start = run_script(script, out, tiny_cache, None)
    assert rc == 0, err[-3000:]
    assert start == previous
    got, tensors = outcome(out)
    assert got == expected  # buffer with scores, replay counts, EMA clock, evaluation losses (slow and fast)
    assert tensors.keys() == expected_tensors.keys()
    for k in tensors:
        assert tensors[k].equal(expected_tensors[k]), k
    # the comparison means something: a buffer of every task, replay, a slow adapter apart from the fast one
    assert sorted({e["task"] for e in expected["buffer"]["entries"]}) == [0, 1, 2]
    assert all(new > 0 and replayed > 0 for new, replayed in expected["replay_counts"].values())
    assert expected["eval_loss"] != expected["eval_loss_fast"]
