"""Review 27 of SuRe in a user's own Trainer script: a ``compute_loss`` override the pair and
example steps would never call is refused; ``predict_with_generate`` needs a ``Seq2SeqTrainer``
(and ``evaluate`` / ``predict`` pass generation keywords through to it); ``SureArguments`` parse
with ``HfArgumentParser``; ``trainer.model`` answers with the slow adapter whenever no task
trains."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

datasets = pytest.importorskip("datasets")

from transformers import (  # noqa: E402
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from surecl.adapters import FAST, SLOW, resolve_beta  # noqa: E402
from surecl.data.tiny import tiny_stream  # noqa: E402
from surecl.errors import SureclError  # noqa: E402
from surecl.integrations.transformers import SureArguments, SureTrainer  # noqa: E402
from surecl.model import holds_adapter_layers  # noqa: E402


def lm_sets(tok, n_train: int = 8, tasks: int = 2):
    def encode(rows):
        ds = datasets.Dataset.from_dict({"text": [f"{e.sentence} Answer: {e.label}" for e in rows]})
        return ds.map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])

    return [encode(t.train) for t in tiny_stream(n_train=n_train, n_test=1)[:tasks]]


def settings(**kw) -> dict:
    out = dict(per_device_train_batch_size=4, learning_rate=5e-3, num_train_epochs=1, report_to=[], use_cpu=True,
               save_strategy="no", seed=0, disable_tqdm=True, logging_strategy="no")
    out.update(kw)
    return out


def build(loaded, out, sure: SureArguments, cls=SureTrainer, args_cls=TrainingArguments, **kw):
    return cls(model=copy.deepcopy(loaded.model), args=args_cls(str(out), **settings(**kw)),
               data_collator=DataCollatorForLanguageModeling(loaded.tokenizer, mlm=False), sure=sure)


# ---------------------------------------------------------------------- 1. a compute_loss override


class OwnLoss(SureTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class LossBase(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class MixedLoss(SureTrainer, LossBase):
    """The override comes from a class beside SureTrainer, not from a subclass of it."""


@pytest.mark.parametrize("cls", [OwnLoss, MixedLoss])
@pytest.mark.parametrize("replay_loss", ["pair", "example"])
def test_a_compute_loss_override_is_refused_where_its_steps_would_not_call_it(tiny_loaded, tmp_path, cls, replay_loss):
    """A pair / example step computes its loss itself (``_pair_step``): a user's compute_loss
    was silently never called there. One line at construction, naming the fix; the model is
    given back as it came. With ``joint`` it is called, and accepted."""
    model = copy.deepcopy(tiny_loaded.model)
    args = TrainingArguments(str(tmp_path), **settings())
    with pytest.raises(SureclError, match=rf"replay_loss='{replay_loss}'.*{cls.__mro__[0 if cls is OwnLoss else 2].__qualname__}"
                                          r"\.compute_loss.*replay_loss='joint'") as err:
        cls(model=model, args=args, data_collator=DataCollatorForLanguageModeling(tiny_loaded.tokenizer, mlm=False),
            sure=SureArguments(buffer_size=4, replay_loss=replay_loss))
    assert "\n" not in str(err.value) and not holds_adapter_layers(model)


def test_a_compute_loss_override_is_called_with_joint_and_the_librarys_own_is_accepted(tiny_loaded, tmp_path):
    calls = []

    class Counted(SureTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            calls.append(1)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    trainer = build(tiny_loaded, tmp_path / "joint", SureArguments(buffer_size=4), cls=Counted)
    trainer.next_task(lm_sets(tiny_loaded.tokenizer)[0])
    assert len(calls) == trainer.state.global_step == 2
    for replay_loss in ("pair", "example"):  # no override: Trainer's compute_loss, accepted
        assert build(tiny_loaded, tmp_path / replay_loss, SureArguments(buffer_size=4, replay_loss=replay_loss)).sure.replay_loss == replay_loss


def test_sft_trainers_own_compute_loss_is_accepted_and_an_override_of_it_refused(tiny_loaded, tmp_path):
    pytest.importorskip("trl")
    from trl import SFTConfig

    from surecl.integrations.trl import SureSFTTrainer

    class OwnSFT(SureSFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def make(cls, replay_loss):
        args = SFTConfig(str(tmp_path / replay_loss), bf16=False, **settings())
        return cls(model=copy.deepcopy(tiny_loaded.model), args=args, processing_class=tiny_loaded.tokenizer,
                   sure=SureArguments(buffer_size=4, replay_loss=replay_loss))

    for replay_loss in ("joint", "pair", "example"):
        assert make(SureSFTTrainer, replay_loss).sure.replay_loss == replay_loss
    assert make(OwnSFT, "joint").sure.replay_loss == "joint"
    with pytest.raises(SureclError, match=r"replay_loss='pair'.*OwnSFT\.compute_loss.*replay_loss='joint'") as err:
        make(OwnSFT, "pair")
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------- 2. predict_with_generate


def test_predict_with_generate_needs_a_seq2seq_trainer(tiny_loaded, tmp_path):
    """A plain Trainer's evaluate / predict return teacher-forced logits whatever
    ``predict_with_generate`` says: one line, before the model is touched."""
    model = copy.deepcopy(tiny_loaded.model)
    args = Seq2SeqTrainingArguments(str(tmp_path), predict_with_generate=True, **settings())
    with pytest.raises(SureclError, match=r"predict_with_generate=True needs a Seq2SeqTrainer.*SureTrainer, Seq2SeqTrainer") as err:
        SureTrainer(model=model, args=args, data_collator=DataCollatorForLanguageModeling(tiny_loaded.tokenizer, mlm=False),
                    sure=SureArguments(buffer_size=4))
    assert "\n" not in str(err.value) and not holds_adapter_layers(model)
    plain = build(tiny_loaded, tmp_path / "no", SureArguments(buffer_size=4), args_cls=Seq2SeqTrainingArguments)  # without it: fine
    assert not plain.args.predict_with_generate


class SureSeq(SureTrainer, Seq2SeqTrainer):
    pass


def test_a_seq2seq_mix_in_generates_with_the_slow_adapter_and_takes_generation_keywords(tmp_path, tiny_cache):
    from test_seq2seq import tiny_t5
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    path = tiny_t5(tmp_path / "t5", tiny_cache)
    tok = AutoTokenizer.from_pretrained(path)
    stream = tiny_stream(n_train=8, n_test=4)[:2]

    def encode(rows):
        x, y = tok([e.sentence for e in rows]), tok([e.label for e in rows])
        return datasets.Dataset.from_dict({"input_ids": x["input_ids"], "attention_mask": x["attention_mask"], "labels": y["input_ids"]})

    model = T5ForConditionalGeneration.from_pretrained(path)
    args = Seq2SeqTrainingArguments(str(tmp_path / "out"), predict_with_generate=True, **settings())
    trainer = SureSeq(model=model, args=args, data_collator=DataCollatorForSeq2Seq(tok, model=model),
                      sure=SureArguments(buffer_size=4, beta=0.5, target_modules=["q", "v"], lora_dropout=0.0))
    for t in stream:
        trainer.next_task(encode(t.train))
    test = encode(stream[0].test)
    out = trainer.predict(test, max_new_tokens=2)
    ids = torch.tensor([test[0]["input_ids"]])
    with torch.no_grad(), trainer.slow_weights() as slow:
        by_hand = slow.generate(input_ids=ids, max_new_tokens=2, do_sample=False)[0]
    assert out.predictions[0][: len(by_hand)].tolist() == by_hand.tolist()
    assert "eval_loss" in trainer.evaluate(test, max_new_tokens=2)
    assert trainer.evaluate({"a": test}, max_new_tokens=2, adapter=FAST)["eval_a_loss"] == trainer.evaluate(test, adapter=FAST)["eval_loss"]


# ---------------------------------------------------------------------- 3. HfArgumentParser


def test_sure_arguments_parse_from_the_command_line():
    """``HfArgumentParser((SureArguments,))`` stopped with "argument --beta: invalid float value:
    'auto'" on every command line. Now every field parses to its default when not given, and to
    what Python gives for the same value when given (beta as the number, or auto)."""
    parser = HfArgumentParser((SureArguments,))
    (default,) = parser.parse_args_into_dataclasses([])
    assert default == SureArguments() and default.beta == "auto"
    for f in dataclasses.fields(SureArguments):
        assert getattr(default, f.name) == getattr(SureArguments(), f.name), f.name

    (auto,) = parser.parse_args_into_dataclasses(["--beta", "auto"])
    assert auto.beta == "auto"
    (number,) = parser.parse_args_into_dataclasses(["--beta", "0.995"])
    assert number.beta == 0.995 and isinstance(number.beta, float)
    assert number == SureArguments(beta=0.995) and number.dual_config() == SureArguments(beta=0.995).dual_config()
    assert resolve_beta(number.dual_config(), 10) == 0.995 and resolve_beta(auto.dual_config(), 10) == resolve_beta(SureArguments().dual_config(), 10)
    number.check()
    auto.check()

    given = {
        "buffer_size": ("7", 7), "policy": ("random", "random"), "score_time": ("after", "after"), "insert_time": ("after", "after"),
        "reduction": ("sum", "sum"), "ratio": ("1:1", "1:1"), "replay_every": ("3", 3), "replay_batch_size": ("2", 2),
        "replay_loss": ("example", "example"), "replacement": ("true", True), "balance": ("label", "label"),
        "label_column": ("label", "label"), "aging": ("true", True), "dual": ("false", False), "beta": ("0.9", 0.9),
        "window_tasks": ("2.5", 2.5), "bias_correction": ("false", False), "unit": ("example", "example"), "lora_r": ("4", 4),
        "lora_alpha": ("16", 16), "lora_dropout": ("0.0", 0.0), "target_modules": (["q_proj", "k_proj"], ["q_proj", "k_proj"]),
    }
    assert set(given) == {f.name for f in dataclasses.fields(SureArguments)}  # every field, a value other than its default
    argv = []
    for name, (words, _) in given.items():
        argv += [f"--{name}", *(words if isinstance(words, list) else [words])]
    (parsed,) = parser.parse_args_into_dataclasses(argv)
    expected = SureArguments(**{name: value for name, (_, value) in given.items()})
    assert parsed == expected and all(getattr(parsed, n) != getattr(SureArguments(), n) for n in given)
    (flags,) = parser.parse_args_into_dataclasses(["--no_dual", "--no_bias_correction", "--target_modules", "all-linear"])
    assert flags.dual is False and flags.bias_correction is False and flags.target_modules == ["all-linear"]
    flags.check()

    (word,) = parser.parse_args_into_dataclasses(["--beta", "soon"])
    with pytest.raises(SureclError, match=r"SureArguments.beta: a number in \[0, 1\) or 'auto', got 'soon'"):
        word.check()
    assert SureArguments(beta=0.995).beta == 0.995 and SureArguments(beta=0).beta == 0  # Python's numbers as they were
    assert SureArguments(beta="0.5").beta == 0.5


# ---------------------------------------------------------------------- 4. the adapter trainer.model answers with


class Seen(TrainerCallback):
    def __init__(self, trainer):
        self.trainer, self.active = trainer, []

    def on_substep_end(self, args, state, control, **kwargs):
        self.active.append(self.trainer.model.active_adapter)

    def on_step_end(self, args, state, control, **kwargs):
        self.active.append(self.trainer.model.active_adapter)


class Boom(Exception):
    pass


class StopHere(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise Boom


def test_trainer_model_answers_with_the_slow_adapter_outside_training(tiny_loaded, tmp_path):
    """After next_task, ``trainer.model`` (its generate, a plain Trainer or pipeline over it,
    ``merge_and_unload``) answered with the fast adapter, though the slow one is the result.
    Now the slow adapter is active whenever no task trains; the task's steps train the fast one."""
    sets = lm_sets(tiny_loaded.tokenizer)
    trainer = build(tiny_loaded, tmp_path, SureArguments(buffer_size=4, beta=0.5, lora_dropout=0.0), gradient_accumulation_steps=2,
                    per_device_train_batch_size=2)
    assert trainer.model.active_adapter == SLOW
    seen = Seen(trainer)
    trainer.add_callback(seen)
    for data in sets:
        trainer.next_task(data)
        assert trainer.model.active_adapter == SLOW and trainer.dual.active == SLOW
    assert seen.active and set(seen.active) == {FAST}  # every micro-batch and optimizer step of both tasks
    with torch.no_grad():
        answers_slow(trainer, sets, tmp_path)


def answers_slow(trainer, sets, tmp_path):
    """The model as the user takes it after training answers as the slow adapter does."""
    ids = torch.tensor([sets[0][0]["input_ids"]])
    with trainer.slow_weights() as slow:
        slow_logits = slow(input_ids=ids).logits
        slow_ids = slow.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
    with trainer.weights(FAST) as fast:
        fast_logits = fast(input_ids=ids).logits
    assert not torch.equal(slow_logits, fast_logits)
    assert trainer.model.active_adapter == SLOW  # a view of the fast adapter gives the slow one back
    model = trainer.model.eval()
    torch.testing.assert_close(model(input_ids=ids).logits, slow_logits, rtol=0, atol=0)
    assert torch.equal(model.generate(input_ids=ids, max_new_tokens=3, do_sample=False), slow_ids)
    merged = copy.deepcopy(model).merge_and_unload()
    torch.testing.assert_close(merged(input_ids=ids).logits, slow_logits, rtol=1e-4, atol=1e-4)
    plain = Trainer(model=model, args=TrainingArguments(str(tmp_path / "plain"), report_to=[], use_cpu=True, per_device_eval_batch_size=8),
                    data_collator=trainer.data_collator)
    assert plain.evaluate(sets[0])["eval_loss"] == pytest.approx(trainer.evaluate(sets[0])["eval_loss"], rel=1e-6)
    assert trainer.evaluate(sets[0], adapter=FAST)["eval_loss"] != trainer.evaluate(sets[0])["eval_loss"]
    assert trainer.model.active_adapter == SLOW


def test_a_task_that_raised_leaves_the_slow_adapter_active_and_the_retry_trains_the_fast_one(tiny_loaded, tmp_path):
    sets = lm_sets(tiny_loaded.tokenizer)
    trainer = build(tiny_loaded, tmp_path, SureArguments(buffer_size=4, beta=0.5))
    stop = StopHere()
    trainer.add_callback(stop)
    with pytest.raises(Boom):
        trainer.next_task(sets[0])
    assert trainer.model.active_adapter == SLOW
    trainer.remove_callback(stop)
    fast_before = [p.detach().clone() for p in trainer.dual.fast_params]
    trainer.next_task(sets[0])
    assert any(not torch.equal(a, b) for a, b in zip(fast_before, trainer.dual.fast_params))
    assert trainer.model.active_adapter == SLOW


def test_a_training_step_taken_outside_next_task_trains_the_fast_adapter(tiny_loaded, tmp_path):
    """The slow adapter is active from construction on; a ``training_step`` called directly
    still trains the fast one (the slow adapter takes no gradient), and the slow one answers after it."""
    trainer = build(tiny_loaded, tmp_path, SureArguments(buffer_size=4))
    assert trainer.model.active_adapter == SLOW
    data = lm_sets(tiny_loaded.tokenizer)[0]
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # what train() sets before its steps
    loss = trainer.training_step(trainer.model, trainer.data_collator([data[0], data[1]]))
    assert loss.item() > 0 and trainer.model.active_adapter == SLOW
    assert any(p.grad is not None and p.grad.any() for p in trainer.dual.fast_params)
    assert all(p.grad is None for p in trainer.dual.slow_params)


def test_next_task_inside_any_weights_block_is_one_line(tiny_loaded, tmp_path):
    sets = lm_sets(tiny_loaded.tokenizer)
    trainer = build(tiny_loaded, tmp_path, SureArguments(buffer_size=4))
    for adapter in (FAST, SLOW):
        with trainer.weights(adapter), pytest.raises(SureclError, match=r"inside `with trainer.slow_weights\(\)` or `trainer.weights") as err:
            trainer.next_task(sets[0])
        assert "\n" not in str(err.value) and trainer.state.global_step == 0
    assert trainer.next_task(sets[0]) is not None and trainer.model.active_adapter == SLOW


def test_without_the_dual_learner_the_fast_adapter_answers(tiny_loaded, tmp_path):
    trainer = build(tiny_loaded, tmp_path, SureArguments(buffer_size=4, dual=False))
    assert trainer.model.active_adapter == FAST
    trainer.next_task(lm_sets(tiny_loaded.tokenizer)[0])
    assert trainer.model.active_adapter == FAST


def test_save_model_writes_both_adapters_whichever_is_active(tiny_loaded, tmp_path):
    """``save_model`` writes ``fast/`` and ``slow/`` from the adapters' own weights: the same
    files with the slow adapter active (now, after training) as with the fast one."""
    from safetensors.torch import load_file

    trainer = build(tiny_loaded, tmp_path / "run", SureArguments(buffer_size=4, beta=0.5))
    trainer.next_task(lm_sets(tiny_loaded.tokenizer)[0])
    trainer.save_model(str(tmp_path / "slow_active"))
    trainer.dual.activate(FAST)
    trainer.save_model(str(tmp_path / "fast_active"))
    trainer.dual.activate(SLOW)
    for name in (FAST, SLOW):
        a = load_file(str(tmp_path / "slow_active" / name / "adapter_model.safetensors"))
        b = load_file(str(tmp_path / "fast_active" / name / "adapter_model.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        own = {k.replace(f".{name}.", "."): v for k, v in trainer.dual.adapter_state(name).items()}
        assert a.keys() == own.keys() and all(torch.equal(a[k], own[k]) for k in a)
