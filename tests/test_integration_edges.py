"""SureTrainer / SureSFTTrainer at the edges of a user's script: a task retried after an
exception, a model moved after the adapters were built, a padding-free collator, evaluation
(a dict of datasets, nested in ``slow_weights()``, ``predict``), Trainer settings SuRe cannot
honour (best-model reload, full half-precision evaluation, ``ignore_data_skip`` on a mid-task
resume), a non-finite joint loss, and TRL's per-dataset preparation (``shuffle_dataset`` with
a label-balanced buffer, ``completion_only_loss`` decided per evaluation set)."""

from __future__ import annotations

import copy

import pytest
import torch

datasets = pytest.importorskip("datasets")

from test_integration_trainer import lm_sets, make_trainer  # noqa: E402
from trainer_stops import Interrupt, StopAt  # noqa: E402
from transformers import DataCollatorForLanguageModeling, DataCollatorWithFlattening, TrainingArguments  # noqa: E402

from surecl.adapters import FAST, SLOW, DualLoRA  # noqa: E402
from surecl.config import DualConfig, LoraConfig  # noqa: E402
from surecl.data.tiny import tiny_stream  # noqa: E402
from surecl.errors import SureclError  # noqa: E402
from surecl.integrations.transformers import SureArguments, SureTrainer  # noqa: E402


def rows_of(dataset) -> list[tuple[int, ...]]:
    return [tuple(r["input_ids"]) for r in dataset]


# ---------------------------------------------------------------------- a retried task


def test_a_retried_task_replaces_the_failed_call(tiny_loaded, tmp_path):
    """next_task(ds0) stopped by an exception mid-task, then called again for the same task,
    then next_task(ds1): two tasks' sets, task 1 trains on ds1's rows (not on ds0's, appended
    twice), and task 0 counts the retry's examples only."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=16)
    ds0, ds1 = sets[0], sets[1].select(range(12))
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(policy="none"), num_train_epochs=1)
    collate, seen = trainer.data_collator, []

    def recording(features):  # policy none scores nothing: each row is collated once by the row check, then per training batch
        seen.extend(tuple(f["input_ids"]) for f in features)
        return collate(features)

    trainer.data_collator = recording
    trainer.add_callback(StopAt(task=0, step=1))
    with pytest.raises(Interrupt):
        trainer.next_task(ds0)
    assert trainer.task == 0
    trainer.next_task(ds0)
    seen.clear()
    trainer.next_task(ds1)
    assert trainer.task == len(trainer.sets) == len(trainer.labels) == 2
    assert rows_of(trainer.sets[1]) == rows_of(ds1)
    assert sorted(seen) == sorted(rows_of(ds1) * 2)  # the row check, then one epoch of task 1: each of ds1's rows once
    assert trainer.replay_counts == {0: [16, 0], 1: [12, 0]}


# ---------------------------------------------------------------------- the EMA's raw average


def test_the_raw_average_follows_a_model_moved_after_the_adapters(fresh_tiny):
    """transformers.Trainer moves a model loaded on the CPU to its GPU after SureTrainer built
    the adapters: the bias-corrected EMA's raw average (plain tensors) follows the fast
    parameters' device and dtype at the next EMA step, values kept. Simulated here by a move
    to float64 (a GPU takes the same path: Module.to swaps the parameters' data in place, and
    the raw average's tensors are no parameters)."""
    lora = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    dual = DualLoRA(fresh_tiny, lora, DualConfig(enabled=True, beta=0.9, bias_correction=True), is_seq2seq=False)
    with torch.no_grad():
        for p in dual.fast_params:
            p.add_(1.0)
    dual.ema_step()
    raw = [r.clone() for r in dual._raw]
    fast = [p.detach().clone() for p in dual.fast_params]
    dual.model.to(torch.float64)
    dual.ema_step()
    for r, p in zip(dual._raw, dual.fast_params, strict=True):
        assert (r.device, r.dtype) == (p.device, p.dtype) == (torch.device("cpu"), torch.float64)
    for r, r0, f in zip(dual._raw, raw, fast, strict=True):  # raw <- 0.9 raw + 0.1 fast, from the values kept
        torch.testing.assert_close(r, 0.9 * r0.double() + 0.1 * f.double())
    for s, r in zip(dual.slow_params, dual._raw, strict=True):
        torch.testing.assert_close(s, r / (1 - 0.9**2))


# ---------------------------------------------------------------------- a padding-free collator


@pytest.mark.parametrize(
    ("sure", "what"),
    [(SureArguments(buffer_size=4), "scored"), (SureArguments(buffer_size=4, policy="random", replay_loss="pair"), "weighted")],
)
def test_a_padding_free_collator_is_refused_in_one_line(tiny_loaded, tmp_path, sure, what):
    """DataCollatorWithFlattening joins a batch into one row: one surprise for the batch, or
    one pair-weighted row loss for many weights, would silently keep the first examples'
    values; surprise scoring and the pair loss stop in one line instead."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    trainer = make_trainer(tiny_loaded, tmp_path, sure, num_train_epochs=1)
    trainer.data_collator = DataCollatorWithFlattening()
    with pytest.raises(SureclError, match=rf"rows for \d+ examples to be {what} .*DataCollatorWithFlattening") as err:
        trainer.next_task(sets[0])
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------- evaluation


@pytest.fixture(scope="module")
def trained(tiny_loaded, tmp_path_factory):
    """One task trained, beta 0.5: the slow adapter differs from the fast one."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=16)
    trainer = make_trainer(tiny_loaded, tmp_path_factory.mktemp("trained"), SureArguments(buffer_size=8, beta=0.5), num_train_epochs=1)
    trainer.next_task(sets[0])
    ds = sets[0].select(range(8))
    losses = {FAST: trainer.evaluate(ds, adapter=FAST)["eval_loss"], SLOW: trainer.evaluate(ds)["eval_loss"]}
    assert losses[FAST] != losses[SLOW]
    return trainer, ds, losses


def test_a_dict_of_datasets_is_evaluated_on_the_adapter_asked_for(trained):
    """Trainer.evaluate evaluates a dict by calling evaluate once per dataset (without an
    adapter): each dataset of the dict is evaluated on the adapter asked for, given to
    evaluate or as the trainer's eval_dataset."""
    trainer, ds, losses = trained
    assert trainer.evaluate({"a": ds}, adapter=FAST)["eval_a_loss"] == losses[FAST]
    assert trainer.evaluate({"a": ds})["eval_a_loss"] == losses[SLOW]
    trainer.eval_dataset = {"a": ds, "b": ds}  # as given at construction
    try:
        metrics = trainer.evaluate(adapter=FAST)
        assert metrics["eval_a_loss"] == metrics["eval_b_loss"] == losses[FAST]
        assert trainer.evaluate()["eval_b_loss"] == losses[SLOW]
    finally:
        trainer.eval_dataset = None
    assert trainer.dual.active == SLOW  # between tasks the slow adapter answers (trainer.model, generate, merge)


def test_evaluation_inside_slow_weights_leaves_the_slow_adapter(trained):
    """evaluate (on either adapter) and surprise (fast adapter) inside ``with
    trainer.slow_weights():`` restore what was in place on entry: the rest of the block still
    answers with the slow adapter, in eval mode; after it, the slow adapter (what answers
    between tasks) and the mode before. next_task inside the block is one line."""
    trainer, ds, losses = trained
    ids = torch.tensor([ds[0]["input_ids"]])
    mode = trainer.model.training
    with torch.no_grad(), trainer.slow_weights() as model:
        before = model(input_ids=ids).logits
        assert trainer.evaluate(ds, adapter=FAST)["eval_loss"] == losses[FAST]
        assert trainer.evaluate(ds)["eval_loss"] == losses[SLOW]
        trainer.surprise(ds)
        assert model.active_adapter == SLOW and trainer.dual.active == SLOW and not model.training
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)
        with pytest.raises(SureclError, match="inside `with trainer.slow_weights\\(\\)`") as err:
            trainer.next_task(ds)
        assert "\n" not in str(err.value)
    assert trainer.dual.model.active_adapter == SLOW and trainer.model.training == mode


def test_predict_answers_with_the_evaluation_adapter(trained):
    trainer, ds, losses = trained
    assert trainer.predict(ds).metrics["test_loss"] == losses[SLOW]
    assert trainer.predict(ds, adapter=FAST).metrics["test_loss"] == losses[FAST]
    assert trainer.dual.active == SLOW


# ---------------------------------------------------------------------- Trainer settings SuRe cannot honour


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "steps"}, "load_best_model_at_end=True is not supported"),
        ({"bf16_full_eval": True}, "fp16_full_eval / bf16_full_eval are not supported"),
        ({"fp16_full_eval": True}, "fp16_full_eval / bf16_full_eval are not supported"),
        ({"auto_find_batch_size": True}, "auto_find_batch_size=True is not supported"),
    ],
)
def test_trainer_settings_it_cannot_honour_are_one_line_errors(tiny_loaded, tmp_path, settings, match):
    """load_best_model_at_end would find no model weights in a checkpoint (SuRe's adapters are
    its own state) and leave the slow adapter and buffer at the last step; a full half-precision
    evaluation casts the fp32 adapters and the EMA to half precision for good."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=4)
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], **settings)
    collator = DataCollatorForLanguageModeling(tiny_loaded.tokenizer, mlm=False)
    with pytest.raises(SureclError, match=match) as err:
        SureTrainer(model=copy.deepcopy(tiny_loaded.model), args=args, data_collator=collator, eval_dataset=sets[0], sure=SureArguments())
    assert "\n" not in str(err.value)


def test_a_mid_task_resume_refuses_ignore_data_skip(tiny_loaded, tmp_path):
    """With ignore_data_skip the Trainer would retrain the epoch's first batches instead of the
    steps not yet taken, so the resumed run would not end as an uninterrupted one: one line,
    nothing trained; the same checkpoint resumes without it."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=24)
    sure, save = SureArguments(buffer_size=8, beta=0.9), dict(save_strategy="steps", save_steps=2, num_train_epochs=1)
    first = make_trainer(tiny_loaded, tmp_path, sure, **save)
    first.add_callback(StopAt(task=0, step=3))
    with pytest.raises(Interrupt):
        first.next_task(sets[0])
    assert (tmp_path / "task-0" / "checkpoint-2").is_dir()
    trainer = make_trainer(tiny_loaded, tmp_path, sure, ignore_data_skip=True, **save)
    with pytest.raises(SureclError, match="resuming inside task 0 needs ignore_data_skip=False") as err:
        trainer.next_task(sets[0], resume_from_checkpoint=True)
    assert "\n" not in str(err.value) and trainer.state.global_step == 0
    trainer.args.ignore_data_skip = False
    assert trainer.next_task(sets[0], resume_from_checkpoint=True) is not None and trainer.resumed_from.endswith("checkpoint-2")


# ---------------------------------------------------------------------- the user's folder and data


def test_output_dir_is_the_users_again_after_each_task(tiny_loaded, tmp_path):
    """Each task's checkpoints go under task-<t>, but between tasks args.output_dir is the one the
    user gave: save_model() writes there, not into the last task's folder."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1)
    for data in sets[:2]:
        trainer.next_task(data)
        assert trainer.args.output_dir == str(tmp_path)
    trainer.save_model()
    assert (tmp_path / "slow").is_dir() and not (tmp_path / "task-1" / "slow").exists()


def test_a_fresh_run_into_a_folder_with_an_earlier_runs_state_is_refused(tiny_loaded, tmp_path):
    """A run that does not resume, in an output_dir where another SureTrainer left its state:
    one line before anything is trained or written (a later resume=True would take the earlier
    run's newest task); the earlier files stay as they were. The same trainer may retry its
    first task after a failure (its own state is there then)."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    first = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1, save_strategy="steps", save_steps=1)
    first.next_task(sets[0])
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    second = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1, save_strategy="steps", save_steps=1)
    with pytest.raises(SureclError, match="holds an earlier run's SuRe state .*resume_from_checkpoint=True") as err:
        second.next_task(sets[0])
    assert "\n" not in str(err.value) and second.state.global_step == 0
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before
    assert second.next_task(sets[0], resume_from_checkpoint=True) is None  # task 0 was finished: continuing is fine
    retry = make_trainer(tiny_loaded, tmp_path / "other", SureArguments(buffer_size=4), num_train_epochs=1, save_strategy="steps", save_steps=1)
    retry.add_callback(StopAt(task=0, step=1))
    with pytest.raises(Interrupt):
        retry.next_task(sets[0])
    retry.callback_handler.callbacks = [c for c in retry.callback_handler.callbacks if not isinstance(c, StopAt)]
    assert retry.next_task(sets[0]) is not None


def test_a_resume_on_other_training_data_is_refused(tiny_loaded, tmp_path):
    """The state records each task's row count and digest: a resume whose task has other rows
    (fewer, or the same reordered) stops in one line instead of replaying the saved buffer's
    indices into other rows; the same rows resume."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=12)
    first = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1)
    first.next_task(sets[0])
    for changed, words in ((sets[0].select(range(10)), "10 rows, saved with 12"),
                           (sets[0].shuffle(seed=1), "the same 12 rows in another order or with other content")):
        again = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1)
        with pytest.raises(SureclError, match=f"task 0's training data is not the data .* was saved with \\({words}\\)") as err:
            again.next_task(changed, resume_from_checkpoint=True)
        assert "\n" not in str(err.value)
    again = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1)
    assert again.next_task(sets[0], resume_from_checkpoint=True) is None and again.resumed_from.endswith("sure-end")


def test_a_pair_loss_step_puts_the_optimizer_in_train_mode(tiny_loaded, tmp_path):
    """replay_loss="pair" computes its loss itself; like Trainer.training_step it calls the
    optimizer's train() (a schedule-free optimizer evaluates in its eval mode and must train in
    train mode) on every micro-batch."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4, replay_loss="pair"), num_train_epochs=1,
                           per_device_train_batch_size=4)
    calls = []
    real = trainer.create_optimizer

    def create_optimizer(*args, **kwargs):
        opt = real(*args, **kwargs)
        opt.train = lambda: calls.append("train")
        return opt

    trainer.create_optimizer = create_optimizer
    trainer.next_task(sets[0])
    trainer.next_task(sets[1])  # replays: its steps take the pair loss
    assert trainer.replay_counts[1] and calls.count("train") >= 2, (calls, trainer.replay_counts)


# ---------------------------------------------------------------------- a non-finite joint loss


def test_a_non_finite_joint_loss_stops_in_one_line(tiny_loaded, tmp_path):
    """The Trainer's own loss (replay_loss="joint") NaN: one line before the optimizer step,
    so neither adapter, the EMA's raw average nor a checkpoint takes it."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=8)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4), num_train_epochs=1)

    def nan_loss(outputs, labels, num_items_in_batch=None):
        return outputs.logits.float().sum() * float("nan")

    trainer.compute_loss_func = nan_loss
    with pytest.raises(SureclError, match=r"non-finite loss \(nan\) at task 0 step 0: lower learning_rate") as err:
        trainer.next_task(sets[0])
    assert "\n" not in str(err.value)
    assert trainer.dual.steps == 0
    for p in [*trainer.dual.fast_params, *trainer.dual.slow_params, *trainer.dual._raw]:
        assert torch.isfinite(p).all()


# ---------------------------------------------------------------------- TRL


def sft_trainer(loaded, out, sure: SureArguments, tok, eval_dataset=None, **kw):
    from trl import SFTConfig

    from surecl.integrations.trl import SureSFTTrainer

    settings = dict(
        per_device_train_batch_size=4, per_device_eval_batch_size=8, learning_rate=5e-3, num_train_epochs=1, report_to=[],
        use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, logging_strategy="no",
    )
    settings.update(kw)
    return SureSFTTrainer(model=copy.deepcopy(loaded.model), args=SFTConfig(str(out), **settings), processing_class=tok, sure=sure, eval_dataset=eval_dataset)


def test_sft_shuffle_keeps_each_label_with_its_example(tiny_loaded, tmp_path):
    """SFTConfig(shuffle_dataset=True) reorders a task's rows in SFTTrainer's preparation: the
    balanced buffer's labels are read from the prepared rows, each with its own example."""
    pytest.importorskip("trl")
    from test_integration_trl import chat_tokenizer, encode

    rows = tiny_stream(n_train=12, n_test=1)[0].train
    ds = datasets.Dataset.from_dict({
        "messages": [[{"role": "user", "content": e.sentence}, {"role": "assistant", "content": e.label}] for e in rows],
        "row": [str(i) for i in range(len(rows))],
    })
    sure = SureArguments(buffer_size=4, balance="label", label_column="row")
    trainer = sft_trainer(tiny_loaded, tmp_path, sure, chat_tokenizer(tiny_loaded), shuffle_dataset=True, assistant_only_loss=True)
    trainer.next_task(ds)
    expected = [encode(trainer.processing_class, f"{e.sentence} Answer :", e.label)[0] for e in rows]
    prepared = [r["input_ids"] for r in trainer.sets[0]]
    assert prepared != expected and sorted(prepared) == sorted(expected)  # shuffled, none dropped
    assert [expected[int(label)] for label in trainer.labels[0]] == prepared


def test_sft_completion_only_loss_is_decided_per_dataset(tiny_loaded, tmp_path):
    """completion_only_loss left to SFTTrainer's default follows each dataset's own format: a
    prompt/completion evaluation set given as a dict at construction is prepared with its
    completion labels, and after a plain-text task (trained on every token) evaluating it, as
    a dataset, a dict or the construction's dict, still scores the completion alone."""
    pytest.importorskip("trl")
    from test_integration_trl import completion_nll, encode

    stream = tiny_stream(n_train=8, n_test=6)
    test = stream[0].test
    pc = datasets.Dataset.from_dict({"prompt": [f"{e.sentence} Answer :" for e in test], "completion": [f" {e.label}" for e in test]})
    text = datasets.Dataset.from_dict({"text": [f"{e.sentence} Answer : {e.label}" for e in stream[1].train]})
    tok = copy.deepcopy(tiny_loaded.tokenizer)
    trainer = sft_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=4, beta=0.5), tok, eval_dataset={"pc": pc})
    examples = [encode(trainer.processing_class, f"{e.sentence} Answer :", e.label) for e in test]
    completion_labels = [[-100] * (len(ids) - k) + ids[-k:] for ids, k in examples]
    assert [r["labels"] for r in trainer.eval_dataset["pc"]] == completion_labels
    trainer.next_task(text)
    assert trainer.completion_only_loss is False  # the task's own choice
    assert all(-100 not in r["labels"] for r in trainer.sets[0])
    _, slow = completion_nll(trainer, SLOW, examples)
    assert trainer.evaluate(pc)["eval_loss"] == pytest.approx(slow, rel=1e-4)
    assert trainer.evaluate({"pc": pc})["eval_pc_loss"] == pytest.approx(slow, rel=1e-4)
    assert trainer.evaluate()["eval_pc_loss"] == pytest.approx(slow, rel=1e-4)


def test_the_data_digest_reads_each_kind_of_dataset():
    """A datasets.Dataset and a list of dicts are digested row by row (order and content count);
    a torch Dataset, which may build rows on the fly, is compared by length only (None)."""
    import datasets

    from surecl.integrations.transformers import _data_digest

    rows = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}]
    ds = datasets.Dataset.from_list(rows)
    assert _data_digest(ds) == _data_digest(ds.select([0, 1])) != _data_digest(ds.select([1, 0]))
    assert _data_digest(rows) != _data_digest(rows[::-1]) and _data_digest(rows) == _data_digest([dict(r) for r in rows])
    assert _data_digest([{**rows[0], "labels": [1, 2, 3]}, rows[1]]) != _data_digest(rows)

    class Lazy(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return rows[i]

    assert _data_digest(Lazy()) is None
