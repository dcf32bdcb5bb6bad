"""SureTrainer (review 25): rows SuRe cannot score are refused before a task scores or trains
anything; a SIGTERM (JIT) checkpoint saved inside an optimizer step resumes as the uninterrupted
run goes on; under several processes every process takes that checkpoint at the same step."""

from __future__ import annotations

import copy
import json

import pytest

datasets = pytest.importorskip("datasets")

from test_integration_review23 import assert_same_end, jit_manager  # noqa: E402
from test_integration_trainer import lm_sets, make_trainer  # noqa: E402
from test_two_process import run_script_as_two  # noqa: E402
from transformers import DataCollatorForSeq2Seq, TrainerCallback  # noqa: E402

from surecl.errors import SureclError  # noqa: E402
from surecl.integrations.transformers import SureArguments  # noqa: E402

# ---------------------------------------------------------------------- rows without tokens


def with_rows(dataset, rows: dict[int, list[int]], labels: bool = False):
    """``dataset`` with the rows at the given indices replaced by those token lists (with
    ``labels``: every row gets a ``labels`` column, the replaced rows all -100)."""
    out = []
    for i, row in enumerate(dataset.to_list()):
        ids = rows.get(i, row["input_ids"])
        new = {"input_ids": ids, "attention_mask": [1] * len(ids)}
        if labels:
            new["labels"] = [-100] * len(ids) if i in rows else list(ids)
        out.append(new)
    return out


@pytest.mark.parametrize(("case", "policy"), [
    ("empty", "surprise"), ("empty", "random"), ("empty list of dicts", "none"),
    ("one token", "surprise"), ("one token", "random"), ("labels all -100", "surprise"),
])
def test_a_row_sure_cannot_score_is_refused_before_the_task_starts(tiny_loaded, tmp_path, case, policy):
    """An empty row, or one whose labels mark no token, scored 0.0 (a mean over no tokens, the
    lowest surprise, so it took a buffer slot whenever the quota reached it, and the random
    policy drew it like any other), trained nothing as a new or replayed row, and alone in a
    micro-batch gave a traceback from the model (empty) or a NaN loss blamed on the learning
    rate (one token). Now next_task refuses the task in one line naming the first such row and
    counting the others, before anything is scored, buffered or trained, whatever the policy;
    without those rows the same trainer trains the task."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    first = sets[0][0]["input_ids"]
    bad = {3: [], 6: []} if case.startswith("empty") else {3: first[:1], 6: first[:1]} if case == "one token" else {3: first, 6: first}
    rows = with_rows(sets[0], bad, labels=case == "labels all -100")
    data = rows if case == "empty list of dicts" else datasets.Dataset.from_list(rows)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=16, policy=policy), per_device_train_batch_size=1,
                           num_train_epochs=1)
    if case == "labels all -100":
        trainer.data_collator = DataCollatorForSeq2Seq(tiny_loaded.tokenizer)
    what = "has no tokens \\(empty input_ids\\)" if case.startswith("empty") else "has no token its labels mark"
    with pytest.raises(SureclError, match=f"^SureTrainer.next_task: task 0 row 3 \\(and 1 more row like it\\) {what}.*: .*drop") as err:
        trainer.next_task(data)
    assert "\n" not in str(err.value)
    assert trainer.task == 0 and trainer.scores == {} and len(trainer.policy.buffer) == 0 and trainer.state.global_step == 0
    assert not (tmp_path / "task-0").exists()

    kept = [r for i, r in enumerate(rows) if i not in bad]
    trainer.next_task(kept if case == "empty list of dicts" else datasets.Dataset.from_list(kept))
    assert trainer.task == 1 and trainer.state.global_step == 6


def test_rows_with_tokens_all_pass_the_check(tiny_loaded, tmp_path):
    """Rows of two tokens (one scored) and left-padded batches of uneven rows are not refused:
    the check counts a row's tokens as its surprise does, whatever batch it is collated in."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    first = sets[0][0]["input_ids"]
    data = datasets.Dataset.from_list(with_rows(sets[0], {1: first[:2], 5: first[:2]}))
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1)
    trainer.next_task(data)
    assert trainer.task == 1 and min(trainer.scores[0]) > 0


def test_an_empty_text_is_refused_by_the_sft_trainer_naming_its_prepared_row(tiny_loaded, tmp_path):
    """SFTTrainer turns an empty ``text`` row into its EOS alone, a row whose one token is
    predicted from nothing: it scored 0.0 and took a slot of the buffer (the quota held every
    row). Now SureSFTTrainer refuses it in one line naming the row as SFTTrainer prepared it."""
    from trl import SFTConfig

    from surecl.data.tiny import tiny_stream
    from surecl.integrations.trl import SureSFTTrainer

    texts = [f"{e.sentence} Answer : {e.label}" for e in tiny_stream(n_train=8, n_test=1)[0].train]
    texts[2] = ""
    args = SFTConfig(str(tmp_path), per_device_train_batch_size=4, num_train_epochs=1, report_to=[], use_cpu=True, bf16=False,
                     save_strategy="no", disable_tqdm=True, logging_strategy="no")
    trainer = SureSFTTrainer(model=copy.deepcopy(tiny_loaded.model), args=args, processing_class=tiny_loaded.tokenizer,
                             sure=SureArguments(buffer_size=16))
    with pytest.raises(SureclError, match="^SureSFTTrainer.next_task: task 0 row 2 of the dataset SFTTrainer prepared has no token its "
                                          "labels mark") as err:
        trainer.next_task(datasets.Dataset.from_dict({"text": texts}))
    assert "\n" not in str(err.value) and len(trainer.policy.buffer) == 0
    trainer.next_task(datasets.Dataset.from_dict({"text": texts[:2] + texts[3:]}))
    assert trainer.task == 1 and len(trainer.policy.buffer) == 7


# ---------------------------------------------------------------------- JIT checkpoints inside a step


class Timer(TrainerCallback):
    """The JIT manager's flag set as its SIGTERM timer sets it, so that the Trainer's JIT callback
    first sees it at ``where`` of optimizer step ``step`` (counted from 1) of the ``task``-th
    ``train()``: ``before_update`` (after the step's forward and backward passes: the flag set at
    the step's start, after the JIT callback's own look), or ``step_start`` of a step that opens
    an epoch (set in ``on_epoch_begin``, where the JIT callback does not look). No signal is sent."""

    def __init__(self, trainer, task: int, step: int, where: str):
        self.manager, self.task, self.step, self.where, self.calls = jit_manager(trainer), task, step, where, -1

    def on_train_begin(self, args, state, control, **kwargs):
        self.calls += 1

    def _at(self, state, where: str) -> None:
        if self.where == where and self.calls == self.task and state.global_step == self.step - 1:
            self.manager.is_checkpoint_requested = True

    def on_step_begin(self, args, state, control, **kwargs):
        self._at(state, "before_update")

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._at(state, "step_start")


@pytest.mark.parametrize(("where", "step"), [("before_update", 2), ("before_update", 3), ("step_start", 3)])
def test_a_jit_checkpoint_inside_a_step_resumes_as_the_uninterrupted_run(tiny_loaded, tmp_path, where, step):
    """A SIGTERM checkpoint the Trainer saves inside step ``step`` is named after the step before
    it, with that step's weights, optimizer and SuRe state, but it saved the random states of
    the moment: after the step's LoRA dropout masks (before the update), or after the epoch's
    data loader drew its seed (at an epoch's first step), which the resumed run draws again.
    The resumed run then ended elsewhere than the uninterrupted one (adapters off by 1e-2 to
    4e-3). Now such a checkpoint holds the states of the step it is named after, and the resume
    ends bit for bit where the uninterrupted run ends. Two micro-batches a step, two steps an
    epoch, dropout on."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=16)
    sure = SureArguments(buffer_size=8, ratio="1:2")
    kw = dict(enable_jit_checkpoint=True, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    ref = make_trainer(tiny_loaded, tmp_path / "ref", sure, **kw)
    for d in sets[:2]:
        ref.next_task(d)

    out = tmp_path / "run"
    stopped = make_trainer(tiny_loaded, out, sure, **kw)
    stopped.add_callback(Timer(stopped, task=1, step=step, where=where))
    stopped.next_task(sets[0])
    with pytest.raises(SureclError, match="task 1 stopped at step .* rerun with resume_from_checkpoint=True"):
        stopped.next_task(sets[1])
    assert sorted(p.name for p in (out / "task-1").iterdir()) == [f"checkpoint-{step - 1}"]

    resumed = make_trainer(tiny_loaded, out, sure, **kw)
    for d in sets[:2]:
        resumed.next_task(d, resume_from_checkpoint=True)
    assert resumed.resumed_from == str(out / "task-1" / f"checkpoint-{step - 1}")
    assert_same_end(resumed, ref)


# ---------------------------------------------------------------------- two processes

TWO_SCRIPT = r'''
"""Each of two processes trains one task three times with enable_jit_checkpoint: uninterrupted;
with the SIGTERM timers of the two processes ending on either side of a step's start (process
r's flag set for the JIT callback's look before the update of step 2 + r), then resumed; and
with only process 1 signalled. Each writes OUT/rank<r>.json."""
import copy
import copy
import json
import os
import sys
from pathlib import Path

import datasets
import torch
from transformers import DataCollatorForLanguageModeling, TrainerCallback, TrainingArguments

from surecl.config import ModelConfig
from surecl.data.tiny import tiny_stream
from surecl.errors import SureclError
from surecl.integrations.transformers import SureArguments, SureTrainer
from surecl.model import load_model

out, cache = Path(sys.argv[1]), Path(sys.argv[2])
rank = int(os.environ["RANK"])
loaded = load_model(ModelConfig(name="tiny"), torch.device("cpu"), cache)
tok = loaded.tokenizer
data = datasets.Dataset.from_dict({"text": [f"{e.sentence} Answer: {e.label}" for e in tiny_stream(n_train=16, n_test=1)[0].train]})
data = data.map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])


def trainer(folder):
    args = TrainingArguments(str(out / folder), per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2,
                             report_to=[], use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True, logging_strategy="no",
                             enable_jit_checkpoint=True)
    return SureTrainer(model=copy.deepcopy(loaded.model), args=args, data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
                       sure=SureArguments(buffer_size=4))


class Timer(TrainerCallback):
    def __init__(self, t, at):
        self.manager = next(cb for cb in t.callback_handler.callbacks if type(cb).__name__ == "JITCheckpointCallback").jit_manager
        self.at = at

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.at:
            self.manager.is_checkpoint_requested = True


def stop(folder, at):
    t = trainer(folder)
    t.add_callback(Timer(t, at))
    try:
        t.next_task(data)
        said = "finished"
    except SureclError as e:
        said = str(e)
    task = out / folder / "task-0"
    return {"said": said, "saved": {c.name: sorted(f.name for f in c.iterdir()) for c in task.iterdir()}}


def end(t):
    tensors = t.dual.state_dict()[1]
    return {k: v.tolist() for k, v in sorted(tensors.items())}, t.policy.buffer.state_dict(), t.replay_counts


ref = trainer("ref")
ref.next_task(data)
record = {"skewed": stop("skewed", 2 + rank), "alone": stop("alone", 3 if rank == 1 else 0)}
resumed = trainer("skewed")
resumed.next_task(data, resume_from_checkpoint=True)
record["resumed_from"] = resumed.resumed_from
record["same_end"] = end(resumed) == end(ref)
(out / f"rank{rank}.json").write_text(json.dumps(record))
'''


@pytest.mark.slow
def test_two_processes_take_the_sigterm_checkpoint_at_one_step(tiny_cache, tmp_path):
    """Each process's JIT flag comes from its own timer, and the Trainer looks at it on its own:
    when the timers ended on either side of a step's start (or one process alone was
    signalled), one process saved and stopped while the other trained on, waiting for it in the
    next collective: the job hung, and the checkpoint lacked the other process's random state,
    so no resume could take it. Now both processes save the same checkpoint at the first point
    either asked, stop with the same line, and the resume ends where the uninterrupted run ends."""
    codes, log = run_script_as_two(TWO_SCRIPT, tmp_path, tiny_cache, timeout=240)
    assert codes == [0, 0], log
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    complete = {"optimizer.pt", "rng_state_0.pth", "rng_state_1.pth", "sure_state.json", "sure_state.safetensors", "trainer_state.json"}
    for run, step in [("skewed", 1), ("alone", 2)]:
        said = {r[run]["said"] for r in records}
        assert len(said) == 1 and f"task 0 stopped at step {step + 1} of 4" in said.pop(), run
        saved = records[0][run]["saved"]
        assert list(saved) == [f"checkpoint-{step}"], run
        assert complete <= set(saved[f"checkpoint-{step}"]), run
    for r in records:
        assert r["resumed_from"] == str(tmp_path / "skewed" / "task-0" / "checkpoint-1")
        assert r["same_end"] is True
