"""SureTrainer (review 23): a task a JIT checkpoint stopped is not marked finished and resumes
exactly; states saved before ``SureArguments.replacement`` existed resume; two processes given
other rows for a task stop in one line; an explicit resume from an earlier state sets the
abandoned run's later states aside; ``split_batches`` is refused; ``data_seed`` orders the
batches and the replay draws; a dataset that is not map-style, an unknown policy and an
unknown adapter are one line."""

from __future__ import annotations

import json
import logging
import signal

import pytest
import torch

datasets = pytest.importorskip("datasets")

from test_integration_trainer import lm_sets, make_trainer  # noqa: E402
from test_two_process import run_script_as_two  # noqa: E402
from trainer_stops import Interrupt, StopAt  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from surecl.errors import SureclError  # noqa: E402
from surecl.integrations.transformers import SureArguments, SureTrainer  # noqa: E402


def final(trainer) -> tuple:
    return trainer.dual.state_dict()[1], trainer.policy.buffer.state_dict(), trainer.replay_counts, trainer.dual.steps


def assert_same_end(a, b) -> None:
    ta, ba, ca, sa = final(a)
    tb, bb, cb, sb = final(b)
    assert (ba, ca, sa) == (bb, cb, sb)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


def jit_manager(trainer):
    return next(cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == "JITCheckpointCallback").jit_manager


class Preempt(TrainerCallback):
    """What a SIGTERM does under ``enable_jit_checkpoint`` once the Trainer's wait is over (its
    JIT manager's flag set, as its timer sets it), between the optimizer update of step ``step``
    of the ``task``-th ``train()`` and that step's end; no signal is sent. Records, in every
    ``train()``, whether the Trainer's SIGTERM handler is in place."""

    def __init__(self, trainer, task: int, step: int):
        self.manager, self.task, self.step, self.calls, self.armed = jit_manager(trainer), task, step, -1, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.calls += 1
        self.armed.append(signal.getsignal(signal.SIGTERM) == self.manager._sigterm_handler)

    def on_optimizer_step(self, args, state, control, **kwargs):  # global_step counts the step at its end
        if self.calls == self.task and state.global_step == self.step - 1:
            self.manager.is_checkpoint_requested = True


def test_a_jit_checkpoint_leaves_its_task_unfinished_and_resumes_exactly(tiny_loaded, tmp_path):
    """``train()`` returned normally after the JIT checkpoint, so the task's end was written
    (done) and the script went on: the task was cut short and marked finished for good. Now
    next_task stops in one line, the task has no end state, and a rerun with
    ``resume_from_checkpoint=True`` continues from the JIT checkpoint to the uninterrupted
    run's end bit for bit (the step's EMA update and counts are in that checkpoint: the EMA
    callback runs before the JIT one). The Trainer's SIGTERM handler is in place in every
    task's ``train()``, not the first one's only."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=16)
    sure = SureArguments(buffer_size=8, ratio="1:2")
    ref = make_trainer(tiny_loaded, tmp_path / "ref", sure, enable_jit_checkpoint=True)
    for d in sets[:2]:
        ref.next_task(d)

    out = tmp_path / "run"
    stopped = make_trainer(tiny_loaded, out, sure, enable_jit_checkpoint=True)
    preempt = Preempt(stopped, task=1, step=2)
    stopped.add_callback(preempt)
    stopped.next_task(sets[0])
    with pytest.raises(SureclError, match=r"task 1 stopped at step 2 of 4 .*rerun with resume_from_checkpoint=True") as err:
        stopped.next_task(sets[1])
    assert "\n" not in str(err.value)
    assert preempt.armed == [True, True]
    assert not (out / "task-1" / "sure-end").exists()
    assert (out / "task-1" / "checkpoint-2" / "sure_state.json").is_file()

    resumed = make_trainer(tiny_loaded, out, sure, enable_jit_checkpoint=True)
    results = [resumed.next_task(d, resume_from_checkpoint=True) for d in sets[:2]]
    assert results[0] is None and results[1] is not None
    assert resumed.resumed_from == str(out / "task-1" / "checkpoint-2")
    assert_same_end(resumed, ref)


def test_a_state_saved_before_replacement_existed_resumes(tiny_loaded, tmp_path):
    """A state whose ``sure`` record lacks a field added since (``replacement``) was saved under
    that field's default: it resumes; a real difference is still refused."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    sure = SureArguments(buffer_size=4)
    make_trainer(tiny_loaded, tmp_path, sure, num_train_epochs=1).next_task(sets[0])
    state = tmp_path / "task-0" / "sure-end" / "sure_state.json"
    meta = json.loads(state.read_text())
    del meta["sure"]["replacement"]
    state.write_text(json.dumps(meta))

    resumed = make_trainer(tiny_loaded, tmp_path, sure, num_train_epochs=1)
    assert resumed.next_task(sets[0], resume_from_checkpoint=True) is None
    assert resumed.resumed_from == str(state.parent)

    with pytest.raises(SureclError, match=r"other SureArguments \(replacement False -> True\)"):
        make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4, replacement=True), num_train_epochs=1).next_task(
            sets[0], resume_from_checkpoint=True)
    meta["sure"]["buffer_size"] = 5
    state.write_text(json.dumps(meta))
    with pytest.raises(SureclError, match=r"other SureArguments \(buffer_size 5 -> 4\)"):
        make_trainer(tiny_loaded, tmp_path, sure, num_train_epochs=1).next_task(sets[0], resume_from_checkpoint=True)


def test_an_explicit_resume_sets_the_abandoned_runs_later_states_aside(tiny_loaded, tmp_path, caplog):
    """Run A finishes two tasks; run B (another learning rate) resumes from A's task-0 end and is
    stopped inside task 1; run C resumes with True. C took A's task-1 end (B's retrained task 1
    silently replaced by A's); now B moved A's task-1 states aside when it started task 1, so C
    continues B's task 1 from B's checkpoint. A's states are kept, moved, not deleted."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=16)
    sure = SureArguments(buffer_size=8)
    kw = dict(save_strategy="steps", save_steps=2)
    a = make_trainer(tiny_loaded, tmp_path, sure, **kw)
    for d in sets[:2]:
        a.next_task(d)
    a_end = (tmp_path / "task-1" / "sure-end" / "sure_state.json").read_text()

    b = make_trainer(tiny_loaded, tmp_path, sure, learning_rate=1e-3, **kw)
    b.add_callback(StopAt(0, 3))  # the first train() call is task 1's: task 0 is resumed, not trained
    with caplog.at_level(logging.WARNING, logger="surecl"), pytest.raises(Interrupt):
        for d in sets[:2]:
            b.next_task(d, resume_from_checkpoint=str(tmp_path / "task-0" / "sure-end"))
    assert b.task == 1
    aside = tmp_path / "superseded-1" / "task-1"
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint-2", "checkpoint-4", "sure-end"]
    assert (aside / "sure-end" / "sure_state.json").read_text() == a_end
    assert "superseded-1" in caplog.text
    assert not (tmp_path / "task-1" / "sure-end").exists() and not (tmp_path / "task-1" / "checkpoint-4").exists()

    c = make_trainer(tiny_loaded, tmp_path, sure, learning_rate=1e-3, **kw)
    results = [c.next_task(d, resume_from_checkpoint=True) for d in sets[:2]]
    assert c.resumed_from == str(tmp_path / "task-1" / "checkpoint-2")
    assert results[0] is None and results[1] is not None


def test_split_batches_is_refused(tiny_loaded, tmp_path):
    """SuRe plans per_device_train_batch_size rows per process; split_batches would have meant a
    global batch split over the processes, and was ignored."""
    with pytest.raises(SureclError, match="split_batches=True is not supported") as err:
        make_trainer(tiny_loaded, tmp_path, SureArguments(), accelerator_config={"split_batches": True})
    assert "\n" not in str(err.value)


def test_data_seed_orders_the_batches_and_the_replay_draws(tiny_loaded, tmp_path):
    """``data_seed`` was ignored (batches and replay draws came from ``seed``). Now with
    ``seed=0, data_seed=7`` a run takes the batches, buffer and replay draws of ``seed=7`` (the
    ``random`` policy: its choice does not depend on the model), a checkpoint records it, a
    mid-task resume under another ``data_seed`` is refused, and a mid-task state saved before
    the key was recorded resumes where data_seed is unset."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    sure = SureArguments(buffer_size=4, policy="random")

    def rows(out, **kw):
        trainer = make_trainer(tiny_loaded, tmp_path / out, sure, per_device_train_batch_size=4, num_train_epochs=1,
                               save_strategy="steps", save_steps=1, **kw)
        seen, share = [], trainer._share
        trainer._share = lambda micro: (seen.append([(t, i, kind) for t, i, kind, _ in micro]), share(micro))[1]
        for d in sets[:2]:
            trainer.next_task(d)
        return seen, trainer

    by_data_seed, _ = rows("data_seed", seed=0, data_seed=7)
    by_seed, _ = rows("seed", seed=7)
    plain, _ = rows("plain", seed=0)
    assert by_data_seed == by_seed != plain
    assert any(kind == 1 for step in plain for _, _, kind in step)  # task 1 replays
    checkpoint = tmp_path / "data_seed" / "task-1" / "checkpoint-1"
    assert json.loads((checkpoint / "sure_state.json").read_text())["plan"]["data_seed"] == 7

    other = make_trainer(tiny_loaded, tmp_path / "data_seed", sure, per_device_train_batch_size=4, num_train_epochs=1, seed=0, data_seed=8)
    with pytest.raises(SureclError, match=r"another batch plan \(data_seed 7 -> 8"):
        for d in sets[:2]:
            other.next_task(d, resume_from_checkpoint=str(checkpoint))
    assert not (tmp_path / "data_seed" / "superseded-1").exists()  # a refused resume sets nothing aside

    older = tmp_path / "plain" / "task-1" / "checkpoint-1"
    meta = json.loads((older / "sure_state.json").read_text())
    del meta["plan"]["data_seed"]
    (older / "sure_state.json").write_text(json.dumps(meta))
    again = make_trainer(tiny_loaded, tmp_path / "plain", sure, per_device_train_batch_size=4, num_train_epochs=1, seed=0)
    results = [again.next_task(d, resume_from_checkpoint=str(older)) for d in sets[:2]]
    assert results[0] is None and results[1] is not None and again.resumed_from == str(older)


@pytest.mark.parametrize(
    "case", ["list of strings", "iterable dataset", "dict of lists", "dataset dict", "tensor", "untokenised dataset"],
)
def test_a_dataset_sure_cannot_index_is_one_line(tiny_loaded, tmp_path, case):
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    good = sets[0]
    data = {
        "list of strings": ["a b c", "d e f"],
        "iterable dataset": good.to_iterable_dataset(),
        "dict of lists": {"input_ids": [[1, 2, 3]], "attention_mask": [[1, 1, 1]]},
        "dataset dict": datasets.DatasetDict({"train": good}),
        "tensor": torch.ones(4, 5, dtype=torch.long),
        "untokenised dataset": datasets.Dataset.from_dict({"text": ["a b c", "d e f"]}),
    }[case]
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1)
    with pytest.raises(SureclError, match="map-style dataset whose rows are mappings|no column the model reads") as err:
        trainer.next_task(data)
    assert "\n" not in str(err.value)
    if case == "dataset dict":
        assert "pass one split (dataset['train'])" in str(err.value)
    trainer.next_task(good)  # the trainer is as it was
    assert trainer.task == 1


def test_an_unknown_policy_names_the_allowed_ones():
    with pytest.raises(SureclError, match=r"SureArguments.policy: unknown policy 'nonexistent'; use surprise, random or none") as err:
        SureArguments(policy="nonexistent").check()
    assert "reservoir" not in str(err.value)


@pytest.mark.parametrize(("dual", "adapter", "names"), [(True, "bogus", "'slow' or 'fast'"), (False, "slow", "'fast' \\(dual=False")])
def test_an_unknown_adapter_is_one_line(tiny_loaded, tmp_path, dual, adapter, names):
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4, dual=dual))
    for call in (lambda: trainer.evaluate(sets[0], adapter=adapter), lambda: trainer.predict(sets[0], adapter=adapter)):
        with pytest.raises(SureclError, match=f"adapter={adapter!r} is not one of this trainer's adapters; use {names}"):
            call()


# ---------------------------------------------------------------------- two processes

TWO_SCRIPT = r'''
"""Two processes given the same rows for task 0 and differently shuffled rows for task 1 (an
unseeded shuffle in a user's script); each writes what next_task said to OUT/rank<r>.json."""
import json
import os
import sys
from pathlib import Path

import datasets
import torch
from transformers import DataCollatorForLanguageModeling, TrainingArguments

from surecl.config import ModelConfig
from surecl.data.tiny import tiny_stream
from surecl.errors import SureclError
from surecl.integrations.transformers import SureArguments, SureTrainer
from surecl.model import load_model

out, cache = Path(sys.argv[1]), Path(sys.argv[2])
rank = int(os.environ["RANK"])
loaded = load_model(ModelConfig(name="tiny"), torch.device("cpu"), cache)
tok = loaded.tokenizer
sets = [datasets.Dataset.from_dict({"text": [f"{e.sentence} Answer: {e.label}" for e in t.train]}).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
        for t in tiny_stream(n_train=8, n_test=1)[:2]]
sets[1] = sets[1].shuffle(seed=100 + rank)
args = TrainingArguments(str(out / "run"), per_device_train_batch_size=2, num_train_epochs=1, report_to=[], use_cpu=True, save_strategy="no",
                         seed=0, disable_tqdm=True, logging_strategy="no")
trainer = SureTrainer(model=loaded.model, args=args, data_collator=DataCollatorForLanguageModeling(tok, mlm=False), sure=SureArguments(buffer_size=4))
said = []
for d in sets:
    try:
        trainer.next_task(d)
        said.append("trained")
    except SureclError as e:
        said.append(str(e))
        break
(out / f"rank{rank}.json").write_text(json.dumps(said))
'''


@pytest.mark.slow
def test_two_processes_given_other_rows_stop_in_one_line(tiny_loaded, tiny_cache, tmp_path):
    """Task 1's rows shuffled differently on the two processes were accepted: each process's
    buffer entries (task, index) then named other rows. Now both processes stop at task 1 with
    the same line (none is left waiting in a collective); task 0, the same on both, trains."""
    codes, log = run_script_as_two(TWO_SCRIPT, tmp_path, tiny_cache, timeout=300)
    assert codes == [0, 0], log
    said = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert said[0] == said[1]
    assert said[0][0] == "trained" and len(said[0]) == 2
    assert "task 1's rows differ between processes (process 1 against process 0: the same 8 rows in another order" in said[0][1]
    assert "seed your shuffles and splits" in said[0][1] and "\n" not in said[0][1]


@pytest.mark.parametrize("world", [1, 2])
def test_a_process_that_stopped_alone_stops_next_task_with_one_line(world, monkeypatch):
    """Under several processes, the backend's error for a process that has gone (out of a
    collective in next_task) is one line saying how the script resumes; alone, or any other
    error, passes unchanged."""
    import torch.distributed as dist

    from surecl.integrations.transformers import PEER_STOPPED

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: world)
    gone = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:12345")

    class Stopped:
        def _next_task(self, *args):
            raise gone

    if world > 1:
        with pytest.raises(SureclError) as caught:
            SureTrainer.next_task(Stopped(), None)
        assert str(caught.value) == PEER_STOPPED and "resume_from_checkpoint=True" in PEER_STOPPED and caught.value.__cause__ is gone
    else:
        with pytest.raises(RuntimeError, match="Connection closed by peer"):
            SureTrainer.next_task(Stopped(), None)
