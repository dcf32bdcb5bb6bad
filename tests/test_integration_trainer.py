"""SureTrainer: SuRe inside a transformers Trainer script (surecl.integrations.transformers)."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")

from trainer_stops import Interrupt, StopAt  # noqa: E402
from transformers import DataCollatorForLanguageModeling, TrainingArguments  # noqa: E402

from surecl.adapters import FAST  # noqa: E402
from surecl.data.tiny import tiny_stream  # noqa: E402
from surecl.errors import SureclError  # noqa: E402
from surecl.integrations.transformers import SureArguments, SureTrainer  # noqa: E402
from surecl.replay.buffer import QuotaBuffer  # noqa: E402
from surecl.replay.surprise import score_examples  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Use it in your own Trainer script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs(tmp_path, tiny_cache, monkeypatch):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 20
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    trainer = scope["trainer"]
    assert trainer.task == len(scope["tasks"]) == 4
    assert (tmp_path / "runs" / "sure-trainer" / "task-3" / "sure-end" / "sure_state.json").is_file()
    assert len(trainer.policy.buffer) == 16 and sorted(trainer.policy.buffer.by_task) == [0, 1, 2, 3]


# ---------------------------------------------------------------------- helpers


def lm_sets(tok, n_train: int = 32, n_test: int = 16):
    def encode(rows):
        ds = datasets.Dataset.from_dict({"text": [f"{e.sentence} Answer: {e.label}" for e in rows]})
        return ds.map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])

    stream = tiny_stream(n_train=n_train, n_test=n_test)
    return stream, [encode(t.train) for t in stream]


def make_trainer(loaded, out, sure: SureArguments, seed: int = 0, **kw) -> SureTrainer:
    settings = dict(
        per_device_train_batch_size=8, learning_rate=5e-3, num_train_epochs=2, report_to=[], use_cpu=True,
        save_strategy="no", seed=seed, disable_tqdm=True, logging_strategy="no",
    )
    settings.update(kw)
    args = TrainingArguments(str(out), **settings)
    collator = DataCollatorForLanguageModeling(loaded.tokenizer, mlm=False)
    return SureTrainer(model=copy.deepcopy(loaded.model), args=args, data_collator=collator, sure=sure)


def pad_collator(pad_id: int):
    """Right-padded causal batches whose labels mark every real token (the core's ``sequence`` scope)."""

    def collate(rows):
        n = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), n), pad_id)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for k, r in enumerate(rows):
            ids[k, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[k, : len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    return collate


# ---------------------------------------------------------------------- agreement with the core


def test_surprise_and_buffer_equal_the_core(tiny_loaded, task_examples, tmp_path):
    """The trainer's surprise equals the core scorer's (sequence scope, mean) on the same
    examples, and its buffer is the core's QuotaBuffer fed those scores, task after task."""
    items = [task_examples(t, 24, 0) for t in range(2)]
    sets = [datasets.Dataset.from_dict({"input_ids": [e.prompt + e.answer for e in task]}) for task in items]
    args = TrainingArguments(
        str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=5, num_train_epochs=1, report_to=[],
        use_cpu=True, save_strategy="no", disable_tqdm=True, logging_strategy="no", learning_rate=5e-3,
    )
    trainer = SureTrainer(
        model=copy.deepcopy(tiny_loaded.model), args=args, data_collator=pad_collator(tiny_loaded.tokenizer.pad_token_id),
        sure=SureArguments(buffer_size=10, ratio="1:2"),
    )
    core = QuotaBuffer(10)
    for t in range(2):
        with trainer.dual.evaluating(FAST) as model:
            expected = score_examples(model, items[t], pad_id=tiny_loaded.tokenizer.pad_token_id, is_seq2seq=False, scope="sequence", share_prefix=False)
        trainer.next_task(sets[t])
        assert trainer.scores[t] == pytest.approx(expected, abs=1e-4)
        core.add_task(t, trainer.scores[t])
        assert trainer.policy.buffer.state_dict() == core.state_dict()
    assert [len(v) for v in trainer.policy.buffer.by_task.values()] == [5, 5]


@pytest.mark.parametrize(("ratio", "every", "size"), [("1:2", 2, 4), ("1:3", 2, 4), ("", 2, 3)])
def test_replay_ratio_counted(tiny_loaded, tmp_path, ratio, every, size):
    """New and replayed examples counted in the batches the Trainer trained on: floor(N a / b)
    replayed per N new with ratio a:b (the core's replay_count), or ``size`` every ``every`` steps."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=28)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=12, ratio=ratio, replay_every=every, replay_batch_size=size), gradient_accumulation_steps=2, per_device_train_batch_size=4)
    for ds in sets[:2]:
        trainer.next_task(ds)
    new = 28 * 2  # two epochs
    steps = 4 * 2  # ceil(7 micro-batches / 2) optimizer steps per epoch
    if ratio:
        a, b = (int(x) for x in ratio.split(":"))
        expected = new * a // b
    else:
        expected = size * len(range(0, steps, every))
    # SB-UB: task 0's own share is in the buffer while it trains, so it replays too
    assert trainer.replay_counts == {0: [new, expected], 1: [new, expected]}


@pytest.mark.parametrize("unit", ["step", "example"])
def test_ema_units(tiny_loaded, tmp_path, unit):
    """One EMA update per optimizer step, or one per new example (dual.unit), by the core's DualLoRA."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=20)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=8, unit=unit, beta=0.9, bias_correction=False), num_train_epochs=1)
    trainer.next_task(sets[0])
    assert trainer.dual.steps == 3  # ceil(20 / 8) optimizer steps
    assert trainer.dual.updates == (20 if unit == "example" else 3)
    fast = torch.cat([p.detach().flatten() for p in trainer.dual.fast_params])
    slow = torch.cat([p.detach().flatten() for p in trainer.dual.slow_params])
    assert not torch.allclose(fast, slow)


def test_fractional_epochs_plan_the_trainers_steps(tiny_loaded, tmp_path):
    """num_train_epochs=1.5 stops mid-way through the second epoch, as the Trainer counts it
    (ceil(1.5 x 3) = 5 optimizer steps of 20 examples in batches of 8): the plan, the replay
    counts and the EMA's units (and with them beta='auto') follow those 5 steps."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=20)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=8, unit="example", beta="auto"), num_train_epochs=1.5)
    assert trainer._ema_units(20) == 8 + 8 + 4 + 8 + 8
    trainer.next_task(sets[0])
    assert trainer.state.global_step == trainer.dual.steps == 5
    assert trainer.dual.updates == 36 and trainer.replay_counts[0][0] == 36


def test_evaluate_answers_with_the_slow_adapter(tiny_loaded, tmp_path):
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=16)
    trainer = make_trainer(tiny_loaded, tmp_path, SureArguments(buffer_size=8, beta=0.5))
    trainer.next_task(sets[0])
    slow = trainer.evaluate(sets[0])["eval_loss"]
    fast = trainer.evaluate(sets[0], adapter="fast")["eval_loss"]
    assert slow != fast
    with trainer.slow_weights() as model:
        assert model.active_adapter == "slow" and not model.training
    assert trainer.dual.model.active_adapter == "slow"


def test_settings_it_cannot_run_are_one_line_errors(tiny_loaded, tmp_path):
    with pytest.raises(SureclError, match="per-task quota"):
        make_trainer(tiny_loaded, tmp_path, SureArguments(policy="reservoir"))
    with pytest.raises(SureclError, match="score_time=after"):
        make_trainer(tiny_loaded, tmp_path, SureArguments(score_time="after", insert_time="before"))
    with pytest.raises(SureclError, match="next_task"):
        make_trainer(tiny_loaded, tmp_path, SureArguments()).train()


def test_several_processes_need_the_loss_normalised_over_all(tiny_loaded, tmp_path, monkeypatch):
    """Under several processes a step equals the one-process step only when each process's
    loss is divided by the step's token count over all of them; without that, one line.
    (Training under two processes: tests/test_integration_processes.py.)"""
    monkeypatch.setattr(SureTrainer, "world", property(lambda self: 2))
    with pytest.raises(SureclError, match="average_tokens_across_devices=True") as err:
        make_trainer(tiny_loaded, tmp_path, SureArguments(), average_tokens_across_devices=False)
    assert "\n" not in str(err.value)
    make_trainer(tiny_loaded, tmp_path, SureArguments())  # the default normalises over all processes


# ---------------------------------------------------------------------- checkpoints and resume


def final_state(trainer: SureTrainer):
    _, tensors = trainer.dual.state_dict()
    return tensors, trainer.policy.buffer.state_dict(), trainer.replay_counts, trainer.dual.steps


@pytest.mark.parametrize("step", [3, 4])
def test_resume_from_checkpoint_ends_as_an_uninterrupted_run(tiny_loaded, tmp_path, step):
    """Stopped inside task 1 after step 3 (its checkpoint-2 is the last) or 4 (checkpoint-4),
    the same script rerun with resume_from_checkpoint=True skips task 0, restores the buffer,
    slow adapter and task index, and ends with the same weights, buffer and losses."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=24)
    sets = sets[:3]
    sure = SureArguments(buffer_size=9, ratio="1:2", unit="example", beta=0.9)
    save = dict(save_strategy="steps", save_steps=2)

    ref = make_trainer(tiny_loaded, tmp_path / "ref", sure, **save)
    for ds in sets:
        ref.next_task(ds)

    out = tmp_path / "run"
    first = make_trainer(tiny_loaded, out, sure, **save)
    first.add_callback(StopAt(task=1, step=step))
    with pytest.raises(Interrupt):
        for ds in sets:
            first.next_task(ds)
    assert first.task == 1

    second = make_trainer(tiny_loaded, out, sure, **save)
    done = [second.next_task(ds, resume_from_checkpoint=True) for ds in sets]
    assert done[0] is None and done[1] is not None  # task 0 skipped, task 1 resumed
    assert second.task == 3
    tensors, buffer, counts, ema_steps = final_state(second)
    ref_tensors, ref_buffer, ref_counts, ref_steps = final_state(ref)
    assert buffer == ref_buffer and counts == ref_counts and ema_steps == ref_steps
    assert tensors.keys() == ref_tensors.keys()
    for k in tensors:
        torch.testing.assert_close(tensors[k], ref_tensors[k], rtol=0, atol=0)
    assert second.evaluate(sets[0])["eval_loss"] == ref.evaluate(sets[0])["eval_loss"]


def test_resume_between_tasks_and_state_files(tiny_loaded, tmp_path):
    """A run stopped after task 0's end resumes at task 1; the state is JSON + safetensors."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=16)
    sure = SureArguments(buffer_size=8)
    first = make_trainer(tiny_loaded, tmp_path, sure)
    first.next_task(sets[0])
    end = tmp_path / "task-0" / "sure-end"
    assert sorted(os.listdir(end)) == ["sure_state.json", "sure_state.safetensors"]
    second = make_trainer(tiny_loaded, tmp_path, sure)
    assert second.next_task(sets[0], resume_from_checkpoint=True) is None
    assert second.policy.buffer.state_dict() == first.policy.buffer.state_dict()
    for a, b in zip(second.dual.slow_params, first.dual.slow_params):
        assert torch.equal(a, b)
    assert second.next_task(sets[1], resume_from_checkpoint=True) is not None
    assert second.task == 2


# ---------------------------------------------------------------------- learning and forgetting


def completion_set(tok, rows):
    """Completion-only loss: the labels mark the answer token alone."""
    ids = [tok(f"{e.sentence} Answer: {e.label}")["input_ids"] for e in rows]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": [[-100] * (len(x) - 1) + x[-1:] for x in ids]})


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_learns_and_replay_forgets_less(tiny_loaded, tmp_path, seed):
    """Task 0's answer loss falls from 60.8 to under 1 (seeds 0-4: 0.0-0.80, measured with new
    examples in the core's uniform-batch order); after task 1 it rises less with surprise
    replay than without (seeds 0-4, slow adapter: +1.4, +2.5, +2.8, +3.5, +1.7 with replay
    against +8.3, +12.5, +8.9, +14.0, +11.5 without; the smallest ratio 3.3x), so the test
    asks for 1.5x."""
    from transformers import DataCollatorForSeq2Seq

    stream = tiny_stream(n_train=48, n_test=24)
    tok = tiny_loaded.tokenizer
    test0 = completion_set(tok, stream[0].test)
    rise = {}
    for policy in ["none", "surprise"]:
        sure = SureArguments(buffer_size=24, policy=policy, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"])
        trainer = make_trainer(tiny_loaded, tmp_path / policy, sure, seed=seed, learning_rate=3e-3, num_train_epochs=8)
        trainer.data_collator = DataCollatorForSeq2Seq(tok)
        before = trainer.evaluate(test0)["eval_loss"]
        trainer.next_task(completion_set(tok, stream[0].train))
        learned = trainer.evaluate(test0)["eval_loss"]
        assert learned < 1.0 < 50 < before
        trainer.next_task(completion_set(tok, stream[1].train))
        rise[policy] = trainer.evaluate(test0)["eval_loss"] - learned
    assert rise["none"] > 1.5 * rise["surprise"] > 0


def test_resume_refuses_what_would_silently_be_another_run(tiny_loaded, tmp_path):
    """Resuming with other SureArguments, inside a task under another batch plan, from a
    folder that is no SureTrainer state, from a checkpoint the job stopped writing, or from one
    saved without the optimizer (save_only_model): one line each, nothing trained."""
    _, sets = lm_sets(tiny_loaded.tokenizer, n_train=24)
    sure = SureArguments(buffer_size=9, ratio="1:2", beta=0.9)
    save = dict(save_strategy="steps", save_steps=2)
    out = tmp_path / "run"
    first = make_trainer(tiny_loaded, out, sure, **save)
    first.add_callback(StopAt(task=1, step=3))
    with pytest.raises(Interrupt):
        for ds in sets[:2]:
            first.next_task(ds)
    last = out / "task-1" / "checkpoint-2"
    assert last.is_dir()

    def refused(match, sure_now=sure, where=True, **kw):
        trainer = make_trainer(tiny_loaded, out, sure_now, **{**save, **kw})
        with pytest.raises(SureclError, match=match) as err:
            for ds in sets[:2]:
                trainer.next_task(ds, resume_from_checkpoint=where)
        assert "\n" not in str(err.value)

    refused(r"other SureArguments \(buffer_size 9 -> 12, ratio '1:2' -> '1:3'\)", SureArguments(buffer_size=12, ratio="1:3", beta=0.9))
    refused(r"another batch plan \(micro_batch 8 -> 4, accumulation 1 -> 2;", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    refused("no SuRe state there", where=str(tmp_path / "nowhere"))
    # the same batch plan resumes: 8 a micro-batch whatever splits it
    make_trainer(tiny_loaded, out, sure, **save).next_task(sets[0], resume_from_checkpoint=True)

    (last / "rng_state.pth").unlink()  # as a job killed while the Trainer saved
    trainer = make_trainer(tiny_loaded, out, sure, **save)
    with pytest.raises(SureclError, match="incomplete checkpoint"):
        trainer.next_task(sets[0], resume_from_checkpoint=str(last))
    # with True the newest complete checkpoint is taken: task 1's end was never written, its
    # checkpoint-2 now lacks an RNG state, so task 0's end is where the run resumes
    trainer = make_trainer(tiny_loaded, out, sure, **save)
    assert trainer.next_task(sets[0], resume_from_checkpoint=True) is None and trainer.resumed_from.endswith("sure-end")

    only_model = tmp_path / "only-model"
    first = make_trainer(tiny_loaded, only_model, sure, save_only_model=True, **save)
    first.add_callback(StopAt(task=0, step=3))
    with pytest.raises(Interrupt):
        first.next_task(sets[0])
    trainer = make_trainer(tiny_loaded, only_model, sure, save_only_model=True, **save)
    with pytest.raises(SureclError, match="without the optimizer's state") as err:
        trainer.next_task(sets[0], resume_from_checkpoint=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_rows_surprise_does_not_depend_on_its_batch(tiny_loaded, tmp_path, arch):
    """With the left padding surecl's tokenizers use and DataCollatorForLanguageModeling, a
    padded row was scored one token more (its first real token, predicted from padding) and, on
    a model with learned positions, from shifted positions: scores moved with the batch. Each
    row's score is now the one it has alone (a hand computation on the unpadded row)."""
    from types import SimpleNamespace

    from transformers import GPT2Config, GPT2LMHeadModel

    tok = tiny_loaded.tokenizer
    assert tok.padding_side == "left"
    model, targets = tiny_loaded.model, ["q_proj", "v_proj"]
    if arch == "gpt2":  # learned absolute positions: a shifted row reads other position embeddings
        config = GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=64, n_layer=2, n_head=4, initializer_range=0.5,
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model, targets = GPT2LMHeadModel(config), ["c_attn"]
    loaded = SimpleNamespace(model=model, tokenizer=tok)
    _, sets = lm_sets(tok, n_train=12)
    ds = sets[0]
    assert len({len(r) for r in ds["input_ids"]}) > 1  # rows of several lengths: the batch pads
    trainer = make_trainer(loaded, tmp_path, SureArguments(buffer_size=4, target_modules=targets, lora_dropout=0.0))
    alone, together = [], []
    for size, out in ((1, alone), (len(ds), together)):
        trainer.args.per_device_eval_batch_size = size
        out += trainer.surprise(ds)
    hand = []
    with trainer.dual.evaluating(FAST) as m, torch.no_grad():
        for ids in ds["input_ids"]:
            logp = torch.log_softmax(m(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
            hand.append(float(-logp.gather(1, torch.tensor(ids[1:])[:, None]).mean()))
    assert alone == pytest.approx(hand, rel=1e-5, abs=0)
    assert together == pytest.approx(hand, rel=1e-5, abs=0)
    # the pair loss reads a batch as the model's own loss does on every other step (one row,
    # one way of training it in a run): its token mean is the model's loss
    batch = trainer.data_collator([dict(r) for r in ds])
    trainer.model.eval()  # GPT-2's own dropout off
    with torch.no_grad():
        nll, count = trainer._row_nll(trainer.model, batch)
        own = trainer.model(**batch).loss
    assert float(nll.sum() / count.sum()) == pytest.approx(float(own), rel=1e-5)
