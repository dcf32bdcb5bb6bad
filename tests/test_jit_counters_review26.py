"""SureTrainer (review 26): a SIGTERM (JIT) checkpoint saved inside an optimizer step holds the
Trainer's logged counters (``total_flos``, ``num_input_tokens_seen``) of the step it is named
after, so the resumed run ends with the uninterrupted run's counters."""

from __future__ import annotations

import json

import pytest

datasets = pytest.importorskip("datasets")

from test_integration_trainer import lm_sets, make_trainer  # noqa: E402
from test_trainer_edges_review25 import Timer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from surecl.errors import SureclError  # noqa: E402
from surecl.integrations.transformers import SureArguments  # noqa: E402


class Counters(TrainerCallback):
    """Per ``train()``: the counters a checkpoint would hold at each optimizer step's end
    (``total_flos`` with the flops not yet stored, ``num_input_tokens_seen``), by step."""

    def __init__(self, trainer):
        self.trainer, self.runs = trainer, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.runs.append({})

    def on_step_end(self, args, state, control, **kwargs):
        self.runs[-1][state.global_step] = (state.total_flos + self.trainer.current_flos, state.num_input_tokens_seen)


@pytest.mark.parametrize(("where", "step"), [("before_update", 2), ("before_update", 3), ("step_start", 3)])
def test_a_jit_checkpoint_inside_a_step_holds_the_counters_of_its_step(tiny_loaded, tmp_path, where, step):
    """A SIGTERM checkpoint saved before a step's update is named after the step before, but its
    trainer_state.json counted the step's micro-batches in ``total_flos`` and
    ``num_input_tokens_seen``; the resumed run counted them again and ended above the
    uninterrupted run. Now the checkpoint holds the counters of the step it is named after, the
    resume ends with the uninterrupted run's, and the stopped process's own counters are still
    those of what it ran. Two micro-batches a step, two steps an epoch."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=16)
    sure = SureArguments(buffer_size=8, ratio="1:2")
    kw = dict(enable_jit_checkpoint=True, per_device_train_batch_size=4, gradient_accumulation_steps=2,
              include_num_input_tokens_seen="all")
    ref = make_trainer(tiny_loaded, tmp_path / "ref", sure, **kw)
    seen = Counters(ref)
    ref.add_callback(seen)
    for d in sets[:2]:
        ref.next_task(d)
    end = (ref.state.total_flos, ref.state.num_input_tokens_seen)
    assert end[0] > 0 and end[1] > 0 and end == seen.runs[1][max(seen.runs[1])]

    out = tmp_path / "run"
    stopped = make_trainer(tiny_loaded, out, sure, **kw)
    stopped.add_callback(Timer(stopped, task=1, step=step, where=where))
    live = Counters(stopped)
    stopped.add_callback(live)
    stopped.next_task(sets[0])
    with pytest.raises(SureclError, match="task 1 stopped at step"):
        stopped.next_task(sets[1])
    saved = json.loads((out / "task-1" / f"checkpoint-{step - 1}" / "trainer_state.json").read_text())
    assert (saved["total_flos"], saved["num_input_tokens_seen"]) == seen.runs[1][step - 1]
    assert live.runs[1].items() <= seen.runs[1].items()  # the stopped process counted what it ran
    assert max(live.runs[1]) == (step if where == "before_update" else step - 1)

    resumed = make_trainer(tiny_loaded, out, sure, **kw)
    for d in sets[:2]:
        resumed.next_task(d, resume_from_checkpoint=True)
    assert resumed.resumed_from == str(out / "task-1" / f"checkpoint-{step - 1}")
    assert (resumed.state.total_flos, resumed.state.num_input_tokens_seen) == end
