"""SureTrainer / SureSFTTrainer refuse in one line what would otherwise train something else
than asked: SureArguments values ``surecl run`` refuses (or of the wrong Python type), a
second ``trainer.train()`` after ``next_task``, a collator without labels, a model another
trainer already wrapped, Trainer options the per-task plan replaces, and SFT datasets without
the columns SFTTrainer reads; a string label column is read, then left out of the batches."""

from __future__ import annotations

import copy

import pytest
import torch

datasets = pytest.importorskip("datasets")

from test_integration_trainer import lm_sets, make_trainer  # noqa: E402
from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding, TrainingArguments  # noqa: E402

from surecl.errors import SureclError  # noqa: E402
from surecl.integrations.transformers import SureArguments, SureTrainer  # noqa: E402


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"lora_alpha": 0}, "SureArguments.lora_alpha: 0 must be > 0"),  # trained nothing, silently
        ({"window_tasks": 0}, "SureArguments.window_tasks: 0 must be > 0 with SureArguments.beta=auto"),  # beta 0: slow == fast
        ({"window_tasks": -1}, "SureArguments.window_tasks: -1 must be >= 0"),
        ({"dual": "no"}, "SureArguments.dual: True or False, got 'no'"),  # a truthy string kept the slow adapter on
        ({"window_tasks": "0.5"}, "SureArguments.window_tasks: a number, got '0.5'"),
        ({"window_tasks": float("nan")}, "SureArguments.window_tasks: a finite number"),
        ({"ratio": "", "replay_every": "2"}, "SureArguments.replay_every: a whole number, got '2'"),
        ({"target_modules": "q_proj"}, r"SureArguments.target_modules: a list of module names"),  # split into letters
        ({"lora_r": 0}, "SureArguments.lora_r: 0 must be >= 1"),
        ({"lora_dropout": 1.5}, r"SureArguments.lora_dropout: 1.5 must be in \[0, 1\)"),
        ({"ratio": "1:x"}, "SureArguments.ratio: '1:x' must be 'a:b'"),
    ],
)
def test_sure_arguments_surecl_run_would_refuse_are_one_line(settings, match):
    with pytest.raises(SureclError, match=match) as err:
        SureArguments(**settings).check()
    assert "\n" not in str(err.value)


def test_what_only_the_integration_allows_still_passes():
    SureArguments(beta=0.0).check()  # the slow adapter is the fast one
    SureArguments(ratio="", replay_batch_size=0).check()  # no replay
    SureArguments(window_tasks=1).check()  # an int where a number is asked


def test_train_after_next_task_is_refused(tiny_loaded, tmp_path):
    """It trained the last task again (replay counts doubled, the EMA moved on), with its
    checkpoints outside that task's folder."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1)
    trainer.next_task(sets[0])
    counts, steps = copy.deepcopy(trainer.replay_counts), trainer.dual.steps
    with pytest.raises(SureclError, match=r"next_task\(train_dataset\), one call per task"):
        trainer.train()
    assert trainer.replay_counts == counts and trainer.dual.steps == steps
    trainer.next_task(sets[1])  # the next task still trains
    assert trainer.task == 2


def test_a_collator_without_labels_is_one_line(tiny_loaded, tmp_path):
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, use_cpu=True, report_to=[], save_strategy="no")
    trainer = SureTrainer(model=copy.deepcopy(tiny_loaded.model), args=args, data_collator=DataCollatorWithPadding(tiny_loaded.tokenizer),
                          sure=SureArguments(buffer_size=4))
    with pytest.raises(SureclError, match="the data collator gave no labels") as err:
        trainer.next_task(sets[0])
    assert "\n" not in str(err.value)


def test_a_failed_trainer_leaves_the_model_as_given_and_a_wrapped_one_is_refused(tiny_loaded, tmp_path):
    """The Trainer's own refusal (eval_strategy without an eval set) came after the adapters were
    added in place: building the trainer again on the same model failed in PEFT. Now the model
    is given back as it was; a model another SureTrainer holds is one line."""
    model = copy.deepcopy(tiny_loaded.model)
    before = {n: (p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()}
    collator = DataCollatorForLanguageModeling(tiny_loaded.tokenizer, mlm=False)
    bad = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], eval_strategy="steps")
    with pytest.raises(ValueError):
        SureTrainer(model=model, args=bad, data_collator=collator, sure=SureArguments())
    after = {n: (p.detach(), p.requires_grad) for n, p in model.named_parameters()}
    assert after.keys() == before.keys()
    assert all(torch.equal(after[n][0], before[n][0]) and after[n][1] == before[n][1] for n in before)
    good = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], save_strategy="no")
    SureTrainer(model=model, args=good, data_collator=collator, sure=SureArguments())  # the same model, the setting fixed
    with pytest.raises(SureclError, match="already holds LoRA adapters") as err:
        SureTrainer(model=model, args=good, data_collator=collator, sure=SureArguments())
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("extra", "settings", "match"),
    [
        ({"optimizers": (None, None)}, {}, None),  # the Trainer's default: accepted
        ({"optimizers": "sgd"}, {}, "optimizers= is not supported"),
        ({}, {"train_sampling_strategy": "group_by_length"}, "train_sampling_strategy='group_by_length' is not supported"),
    ],
)
def test_trainer_options_the_task_plan_replaces_are_refused(tiny_loaded, tmp_path, extra, settings, match):
    """An optimizer object was dropped for a fresh AdamW per task, and the sampler for the planned
    batches, silently."""
    model = copy.deepcopy(tiny_loaded.model)
    if extra.get("optimizers") == "sgd":
        extra = {"optimizers": (torch.optim.SGD(model.parameters(), lr=0.1), None)}
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], save_strategy="no", **settings)
    collator = DataCollatorForLanguageModeling(tiny_loaded.tokenizer, mlm=False)
    if match is None:
        SureTrainer(model=model, args=args, data_collator=collator, sure=SureArguments(), **extra)
        return
    with pytest.raises(SureclError, match=match) as err:
        SureTrainer(model=model, args=args, data_collator=collator, sure=SureArguments(), **extra)
    assert "\n" not in str(err.value)


def test_a_string_label_column_named_label_balances_and_is_left_out_of_batches(tiny_loaded, tmp_path):
    """The Trainer keeps a column named like its label names ("label"); a causal LM's collator
    could not batch its strings. It is read for the balanced buffer, then dropped."""
    stream, sets = lm_sets(tiny_loaded.tokenizer, n_train=16)
    ds = sets[0].add_column("label", [e.label for e in stream[0].train])
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4, balance="label", label_column="label"), num_train_epochs=1)
    trainer.next_task(ds)
    assert "label" not in trainer.sets[0].column_names
    assert trainer.labels[0] == [e.label for e in stream[0].train]
    kept = [trainer.labels[0][e.index] for e in trainer.policy.buffer.by_task[0]]
    assert len(kept) == 4 and len(set(kept)) == len(set(trainer.labels[0]))  # every label in the share


def test_sft_datasets_without_sft_columns_or_rows_are_one_line(tiny_loaded, tmp_path):
    pytest.importorskip("trl")
    from test_integration_trl import make

    trainer = make(tiny_loaded, tmp_path, SureArguments(buffer_size=2))
    with pytest.raises(SureclError, match="task 0 has no training examples"):
        trainer.next_task(datasets.Dataset.from_dict({"messages": []}))
    with pytest.raises(SureclError, match=r"columns \['answer', 'question'\]; SFTTrainer reads 'messages'") as err:
        trainer.next_task(datasets.Dataset.from_dict({"question": ["a b", "c d"], "answer": ["x", "y"]}))
    assert "\n" not in str(err.value)


def test_refusals_after_the_model_was_touched_give_it_back_as_given(tiny_loaded, tmp_path):
    """An embedding among target_modules (PEFT adds LoRA layers in place, then DualLoRA refuses
    them) and a replay loss the Trainer's settings contradict: the caller's model keeps no LoRA
    layer and its requires_grad, so the corrected call on the same model goes through."""
    from peft.tuners.lora import LoraLayer

    model = copy.deepcopy(tiny_loaded.model)
    grads = [p.requires_grad for p in model.parameters()]
    collator = DataCollatorForLanguageModeling(tiny_loaded.tokenizer, mlm=False)
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], save_strategy="no")
    with pytest.raises(SureclError, match=r"^SureArguments.target_modules: \['q_proj', 'embed_tokens'\] names embed_tokens, not a linear layer"):
        SureTrainer(model=model, args=args, data_collator=collator, sure=SureArguments(target_modules=["q_proj", "embed_tokens"]))
    # a norm layer: PEFT itself refuses it, after adapting the q_proj layers before it
    with pytest.raises(SureclError, match=r"^SureArguments.target_modules: \['q_proj', 'norm'\] names a module that is not a linear layer"):
        SureTrainer(model=model, args=args, data_collator=collator, sure=SureArguments(target_modules=["q_proj", "norm"]))
    smoothing = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], save_strategy="no", label_smoothing_factor=0.1)
    with pytest.raises(SureclError, match="computes the loss itself"):
        SureTrainer(model=model, args=smoothing, data_collator=collator, sure=SureArguments(replay_loss="pair"))
    assert not any(isinstance(m, LoraLayer) for m in model.modules())
    assert [p.requires_grad for p in model.parameters()] == grads
    SureTrainer(model=model, args=args, data_collator=collator, sure=SureArguments())


def test_a_label_column_stays_when_the_user_keeps_every_column(tiny_loaded, tmp_path):
    """remove_unused_columns=False: the user's own collator reads the raw columns, the label one too."""
    stream, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    ds = sets[0].add_column("label", [e.label for e in stream[0].train])
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=2, balance="label", label_column="label"),
                           remove_unused_columns=False)
    data, labels = trainer._prepared(ds)
    assert "label" in data.column_names and labels == [e.label for e in stream[0].train]


def test_sft_accepts_trls_conversations_rows(tiny_loaded, tmp_path):
    """TRL's from/value 'conversations' format, which SFTTrainer converts to messages, passes the column check."""
    pytest.importorskip("trl")
    from test_integration_trl import make

    trainer = make(tiny_loaded, tmp_path, SureArguments(buffer_size=2), assistant_only_loss=False)
    rows = datasets.Dataset.from_dict({"conversations": [[{"from": "human", "value": "the red"}, {"from": "gpt", "value": "warm"}]] * 2})
    data, _ = trainer._prepared(rows)
    assert len(data) == 2 and "input_ids" in data.column_names


def test_sft_prompt_rows_without_a_completion_are_one_line(tiny_loaded, tmp_path):
    """prompt / response rows (surecl's own JSONL format) pass a column check that knows 'prompt'
    and then fail inside TRL with a KeyError: they are one line naming the column to rename."""
    pytest.importorskip("trl")
    from test_integration_trl import make

    trainer = make(tiny_loaded, tmp_path, SureArguments(buffer_size=2), assistant_only_loss=False)
    rows = datasets.Dataset.from_dict({"prompt": ["the red", "the blue"], "response": ["warm", "cool"]})
    with pytest.raises(SureclError, match=r"rows have 'prompt' but no 'completion' .*: rename 'response' to completion$"):
        trainer.next_task(rows)


@pytest.mark.parametrize("max_steps", [-1, 3])
def test_a_task_smaller_than_a_dropped_micro_batch_is_one_line(tiny_loaded, tmp_path, max_steps):
    """dataloader_drop_last drops a task smaller than one micro-batch whole: the Trainer's
    max_steps ValueError (after the task was scored into the buffer), or a ZeroDivisionError
    planning the EMA with max_steps. The micro-batch counts every process, so a task that
    trains on one process can fail on two."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=6)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), dataloader_drop_last=True, max_steps=max_steps)
    with pytest.raises(SureclError, match=r"task 0 has 6 training examples, fewer than one micro-batch .* \(8 per device x 1 process = 8\)") as err:
        trainer.next_task(sets[0])
    assert "\n" not in str(err.value) and len(trainer.policy) == 0  # refused before the buffer took anything


def test_peft_all_linear_string_adapts_every_linear_layer_but_the_head(tiny_loaded, tmp_path):
    """``target_modules="all-linear"``, as PEFT users write it (any other string is a list of
    letters and stays refused above): every linear layer of the caller's model but lm_head."""
    from peft.tuners.lora import LoraLayer

    from surecl.adapters import adaptable_layers

    model = copy.deepcopy(tiny_loaded.model)
    expected = {n for n, _ in adaptable_layers(model)} - {"lm_head"}
    collator = DataCollatorForLanguageModeling(tiny_loaded.tokenizer, mlm=False)
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], save_strategy="no")
    SureTrainer(model=model, args=args, data_collator=collator, sure=SureArguments(target_modules="all-linear"))
    adapted = {n for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    assert len(expected) >= 7 and adapted == expected


def test_replacement_maps_to_the_cores_key():
    assert SureArguments(replacement=True).replay_config().replacement is True
    assert SureArguments().replay_config().replacement is False
    with pytest.raises(SureclError, match=r"^SureArguments.replacement: True or False, got 'yes'$"):
        SureArguments(replacement="yes").check()
