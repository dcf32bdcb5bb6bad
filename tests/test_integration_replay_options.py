"""SureTrainer's replay options beyond the default (issue 29, item 1): the paper's pair loss
(``replay_loss="pair"``, the core's ``replay.loss=pair``), a label-balanced buffer
(``balance="label"`` with ``label_column``, the core's ``replay.balance=label``) and aging
(``aging=True``, the core's ``replay.aging``)."""

from __future__ import annotations

import copy

import pytest
import torch

datasets = pytest.importorskip("datasets")

from trainer_stops import Interrupt, StopAt  # noqa: E402
from transformers import DataCollatorForLanguageModeling, TrainerCallback, TrainingArguments  # noqa: E402

from surecl.data.tiny import tiny_stream  # noqa: E402
from surecl.errors import SureclError  # noqa: E402
from surecl.integrations.transformers import SureArguments, SureTrainer  # noqa: E402
from surecl.replay.buffer import QuotaBuffer  # noqa: E402
from surecl.step import pair_weights  # noqa: E402


def task_sets(tok, n_train: int = 16, with_label: bool = False):
    def encode(rows):
        ds = datasets.Dataset.from_dict({"text": [f"{e.sentence} Answer: {e.label}" for e in rows], "answer": [e.label for e in rows]})
        ds = ds.map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
        return ds if with_label else ds.remove_columns(["answer"])

    return [encode(t.train) for t in tiny_stream(n_train=n_train, n_test=4)]


def trainer_for(loaded, out, sure: SureArguments, **kw) -> SureTrainer:
    settings = dict(
        per_device_train_batch_size=4, learning_rate=5e-3, num_train_epochs=1, report_to=[], use_cpu=True,
        save_strategy="no", seed=0, disable_tqdm=True, logging_strategy="no", max_grad_norm=0.0,
    )
    settings.update(kw)
    tok = copy.copy(loaded.tokenizer)
    tok.padding_side = "right"
    collator = DataCollatorForLanguageModeling(tok, mlm=False)
    return SureTrainer(model=copy.deepcopy(loaded.model), args=TrainingArguments(str(out), **settings), data_collator=collator, sure=sure)


# ---------------------------------------------------------------------- pair loss


class Grads(TrainerCallback):
    """The fast adapter's accumulated gradient of every optimizer step (before AdamW)."""

    def __init__(self, trainer):
        self.trainer, self.steps = trainer, []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.steps.append([p.grad.detach().clone() for p in self.trainer.dual.fast_params])


def reference_loss(model, batch: dict, n_new: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[int]]:
    """The reference code's weighting, row by row: each row alone through the model (its
    ``outputs.loss``, the token mean), replayed row j paired with new row j mod n_new, a pair's
    loss the mean of its rows', the step's loss the mean over pairs. Also the Trainer's joint
    loss on the same batch, and each row's summed NLL and token count."""
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    row_losses, sums, tokens = [], [], []
    for k in range(ids.shape[0]):
        m = int(mask[k].sum())
        out = model(input_ids=ids[k : k + 1, :m], labels=labels[k : k + 1, :m])
        row_losses.append(out.loss)
        t = int((labels[k, 1:m] != -100).sum())
        tokens.append(t)
        sums.append(out.loss * t)
    groups: list[list[torch.Tensor]] = [[row_losses[i]] for i in range(n_new)]
    for j, loss in enumerate(row_losses[n_new:]):
        groups[j % n_new].append(loss)
    pair = torch.stack([torch.stack(g).mean() for g in groups]).mean()
    joint = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    return pair, joint, sums, tokens


@pytest.mark.parametrize("ratio", ["3:2", "1:2"])
def test_pair_loss_is_the_reference_weighting(tiny_loaded, tmp_path, ratio):
    """The first step of task 0 (SB-UB: its own share is in the buffer, so it replays): 4 new
    rows and 6 (3:2: new row 0 and 1 each pair with 2 replayed) or 2 (1:2) replayed ones. The
    Trainer's loss and accumulated gradient are those of the reference formula computed by hand
    at the same weights, which is also the core's ``pair_weights`` on the rows' summed NLL,
    and not the joint token mean's."""
    sets = task_sets(tiny_loaded.tokenizer)
    trainer = trainer_for(tiny_loaded, tmp_path, SureArguments(buffer_size=8, ratio=ratio, replay_loss="pair", lora_dropout=0.0), max_steps=1)
    grads = Grads(trainer)
    trainer.add_callback(grads)
    seen = []
    step = trainer.training_step

    def spied(model, inputs, num_items_in_batch=None):
        batch = {k: v.clone() for k, v in inputs.items()}
        n_new, n_rep = int(batch["sure_new"]), int(batch["sure_replayed"])
        pair, joint, sums, tokens = reference_loss(trainer.model, batch, n_new)
        params = trainer.dual.fast_params
        expected = dict(
            n=(n_new, n_rep), pair=pair.item(), joint=joint.item(),
            core=sum(w * s.item() for w, s in zip(pair_weights(n_new, tokens), sums)),
            pair_grads=torch.autograd.grad(pair, params, retain_graph=True), joint_grads=torch.autograd.grad(joint, params),
        )
        loss = step(model, inputs, num_items_in_batch)
        seen.append((expected, loss.item()))
        return loss

    trainer.training_step = spied
    trainer.next_task(sets[0])
    (expected, loss), = seen
    assert expected["n"] == ((4, 6) if ratio == "3:2" else (4, 2))
    assert loss == pytest.approx(expected["pair"], rel=1e-5)
    assert expected["core"] == pytest.approx(expected["pair"], rel=1e-5)
    assert abs(expected["pair"] - expected["joint"]) > 1e-3
    got = torch.cat([g.flatten() for g in grads.steps[0]])
    pair = torch.cat([g.flatten() for g in expected["pair_grads"]])
    joint = torch.cat([g.flatten() for g in expected["joint_grads"]])
    assert pair.abs().max() > 0
    assert torch.allclose(got, pair, rtol=1e-4, atol=1e-7 * float(pair.abs().max()))
    assert (got - joint).abs().max() > 1e-2 * pair.abs().max()


def test_pair_weights_span_the_accumulated_step(tiny_loaded, tmp_path):
    """With gradient accumulation the pairs are those of the whole optimizer step (its new rows
    micro-batch after micro-batch, then its replayed rows in draw order), as the core's
    ``TrainStep`` pairs them; a step without replayed rows keeps the Trainer's joint loss."""
    sets = task_sets(tiny_loaded.tokenizer, n_train=20)
    trainer = trainer_for(tiny_loaded, tmp_path, SureArguments(buffer_size=8, ratio="1:2", replay_loss="pair"), gradient_accumulation_steps=2, per_device_train_batch_size=3)
    trainer.sets.append(sets[0])
    trainer.policy.at_task_start(0, len(sets[0]), lambda t: [float(i) for i in range(len(sets[0]))])
    epochs = trainer._plan(0, len(sets[0]))
    steps = [epochs[0][k : k + 2] for k in range(0, len(epochs[0]), 2)]
    # micro-batches of 3 new (the last 2), 2 a step; 1:2 replays 3 a step of 6 (micro-batches 0, 1, 0), 1 in the last
    assert [[len(m) for m in s] for s in steps] == [[5, 4], [5, 4], [5, 4], [3]]
    for step in steps:
        rows = [r for m in step for r in m]
        new = [r for r in rows if r[2] == 0]
        replayed = [r for m in step for r in m if r[2] == 1]
        core = pair_weights(len(new), [1] * len(rows))
        # the core's order: new rows (micro-batch 0's, then 1's), then replayed j in micro-batch j mod 2
        order = new + [step[j % 2][len([r for r in step[j % 2] if r[2] == 0]) + j // 2] for j in range(len(replayed))]
        assert [r[3] for r in order] == pytest.approx(core)
        assert sum(r[3] for r in rows) == pytest.approx(1.0)

    joint = trainer_for(tiny_loaded, tmp_path / "j", SureArguments(buffer_size=8, ratio="1:2", policy="none", replay_loss="pair"))
    joint.sets.append(sets[0])
    assert all(r[3] == -1.0 for m in joint._plan(0, len(sets[0]))[0] for r in m)
    # "example": the reference's weighting on every step, one that replays nothing too (each new
    # row 1 / n_new: the mean of the rows' token means, as micro-batches of one averaged)
    every = trainer_for(tiny_loaded, tmp_path / "e", SureArguments(buffer_size=8, ratio="1:2", policy="none", replay_loss="example"),
                        gradient_accumulation_steps=2, per_device_train_batch_size=3)
    every.sets.append(sets[0])
    micro = every._plan(0, len(sets[0]))[0]
    for step in [micro[k : k + 2] for k in range(0, len(micro), 2)]:
        rows = [r for m in step for r in m]
        assert [r[3] for r in rows] == pytest.approx([1.0 / len(rows)] * len(rows))


def test_pair_and_joint_train_differently(tiny_loaded, tmp_path):
    """Two tasks with pair loss learn (the loss falls) and end with other weights than joint."""
    sets = task_sets(tiny_loaded.tokenizer, n_train=16)
    ends = {}
    for loss in ("joint", "pair"):
        trainer = trainer_for(tiny_loaded, tmp_path / loss, SureArguments(buffer_size=8, ratio="1:2", replay_loss=loss, lora_dropout=0.0), num_train_epochs=2)
        for ds in sets[:2]:
            trainer.next_task(ds)
        assert trainer.replay_counts == {0: [32, 16], 1: [32, 16]}
        ends[loss] = torch.cat([p.detach().flatten() for p in trainer.dual.fast_params])
        assert torch.isfinite(ends[loss]).all()
    assert not torch.allclose(ends["joint"], ends["pair"], atol=1e-4)


# ---------------------------------------------------------------------- label balance and aging


def test_label_balanced_buffer_is_the_cores(tiny_loaded, tmp_path):
    """``balance="label"``: each task's share is the core's balanced QuotaBuffer fed the same
    surprise and the dataset's label column: every label of the task keeps floor(m/K) or one
    more entries, the column itself never reaches the collator."""
    sets = task_sets(tiny_loaded.tokenizer, n_train=16, with_label=True)
    trainer = trainer_for(tiny_loaded, tmp_path, SureArguments(buffer_size=9, balance="label", label_column="answer"))
    core = QuotaBuffer(9, balanced=True)
    for t in range(2):
        trainer.next_task(sets[t])
        labels = [str(v) for v in sets[t]["answer"]]
        core.add_task(t, trainer.scores[t], labels)
        assert trainer.policy.buffer.state_dict() == core.state_dict()
    for t in range(2):
        kept = [trainer.labels[t][e.index] for e in trainer.policy.buffer.by_task[t]]
        counts = sorted(kept.count(k) for k in set(trainer.labels[t]))
        assert len(kept) == 4 and counts[-1] - counts[0] <= 1 and len(set(kept)) == min(4, len(set(trainer.labels[t])))
    unbalanced = QuotaBuffer(9)
    for t in range(2):
        unbalanced.add_task(t, trainer.scores[t])
    assert unbalanced.state_dict()["entries"] != [{k: v for k, v in e.items() if k != "key"} for e in core.state_dict()["entries"]]


class ReplayedScores(TrainerCallback):
    """After every optimizer step: the entries it replayed, their buffer scores, and their
    surprise under the fast adapter as it is now."""

    def __init__(self, trainer, out: list):
        self.trainer, self.out = trainer, out

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        drawn = t._drawn[state.global_step - 1]
        self.out.append(([(e.task, e.index) for e in drawn], [e.score for e in drawn], t._surprise_rows([t.sets[e.task][e.index] for e in drawn])))


def test_aging_rescores_replayed_entries(tiny_loaded, tmp_path):
    """``aging=True``: after every step that replays, the replayed entries' scores are their
    surprise under the fast adapter just updated (the trainer's own scorer on those rows); the
    entries no step replayed keep their insertion score. Without aging every score stays."""
    sets = task_sets(tiny_loaded.tokenizer, n_train=16)
    results = {}
    for aging in (False, True):
        trainer = trainer_for(tiny_loaded, tmp_path / str(aging), SureArguments(buffer_size=12, ratio="1:2", aging=aging), max_steps=2)
        checks = []

        trainer.add_callback(ReplayedScores(trainer, checks))  # after the EMA callback, which ages
        for ds in sets[:2]:
            trainer.next_task(ds)
        results[aging] = (trainer, checks)
    plain, checks = results[False]
    assert all(e.score == plain.scores[e.task][e.index] for e in plain.policy.buffer.entries)
    assert any(scores != pytest.approx(fresh, rel=1e-6) for _, scores, fresh in checks)
    aged, checks = results[True]
    assert len(checks) == 4 and all(len(keys) == 2 for keys, _, _ in checks)  # 2 steps a task, 4 new -> 2 replayed each
    for _, scores, fresh in checks:
        assert scores == pytest.approx(fresh, rel=1e-6)
    replayed = {key for keys, _, _ in checks for key in keys}
    changed = {(e.task, e.index) for e in aged.policy.buffer.entries if e.score != aged.scores[e.task][e.index]}
    assert changed and changed <= replayed


def test_replay_option_errors_are_one_line(tiny_loaded, tmp_path):
    cases = [
        (SureArguments(replay_loss="mean"), "replay_loss: one of joint, pair"),
        (SureArguments(balance="labels"), "balance: one of none, label"),
        (SureArguments(balance="label"), "needs label_column"),
        (SureArguments(balance="label", label_column="answer", policy="none"), "needs a replay policy"),
        (SureArguments(aging=True, policy="random"), "keeps no scores"),
        (SureArguments(aging="yes"), "aging: True or False"),
    ]
    for sure, message in cases:
        with pytest.raises(SureclError, match=message) as err:
            trainer_for(tiny_loaded, tmp_path, sure)
        assert "\n" not in str(err.value)
    with pytest.raises(SureclError, match="compute_loss_func") as err:
        SureTrainer(
            model=copy.deepcopy(tiny_loaded.model), args=TrainingArguments(str(tmp_path), report_to=[], use_cpu=True),
            sure=SureArguments(replay_loss="pair"), compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.loss,
        )
    with pytest.raises(SureclError, match="label_smoothing_factor"):
        trainer_for(tiny_loaded, tmp_path, SureArguments(replay_loss="pair"), label_smoothing_factor=0.1)
    moe = copy.deepcopy(tiny_loaded.model)
    moe.config.output_router_logits = True  # a mixture of experts' auxiliary loss, which the pair loss would drop
    with pytest.raises(SureclError, match="output_router_logits"):
        SureTrainer(model=moe, args=TrainingArguments(str(tmp_path), report_to=[], use_cpu=True), sure=SureArguments(replay_loss="pair"))
    trainer = trainer_for(tiny_loaded, tmp_path, SureArguments(balance="label", label_column="answer"))
    with pytest.raises(SureclError, match="no column 'answer'") as err:
        trainer.next_task(task_sets(tiny_loaded.tokenizer)[0])
    assert "\n" not in str(err.value)


def test_resume_with_every_option_ends_as_an_uninterrupted_run(tiny_loaded, tmp_path):
    """Pair loss, aging and a label-balanced buffer together: a run stopped inside task 1 after
    step 3 (checkpoint-2 the last) and rerun with resume_from_checkpoint=True ends bit for bit
    where the uninterrupted run ends: the checkpoint holds the buffer with the scores aged so
    far and the random state the stage's replay was drawn from."""
    sets = task_sets(tiny_loaded.tokenizer, n_train=20, with_label=True)[:3]
    sure = SureArguments(buffer_size=9, ratio="1:2", replay_loss="pair", aging=True, balance="label", label_column="answer", beta=0.9)
    save = dict(save_strategy="steps", save_steps=2)

    ref = trainer_for(tiny_loaded, tmp_path / "ref", sure, **save)
    for ds in sets:
        ref.next_task(ds)
    inserted = {(t, i): s for t, scores in ref.scores.items() for i, s in enumerate(scores)}
    assert any(e.score != inserted[(e.task, e.index)] for e in ref.policy.buffer.entries), "aging should have changed scores"

    out = tmp_path / "run"
    first = trainer_for(tiny_loaded, out, sure, **save)
    first.add_callback(StopAt(task=1, step=3))
    with pytest.raises(Interrupt):
        for ds in sets:
            first.next_task(ds)
    second = trainer_for(tiny_loaded, out, sure, **save)
    done = [second.next_task(ds, resume_from_checkpoint=True) for ds in sets]
    assert done[0] is None and done[1] is not None and second.resumed_from.endswith("checkpoint-2")
    assert second.policy.buffer.state_dict() == ref.policy.buffer.state_dict()
    assert second.replay_counts == ref.replay_counts and second.dual.steps == ref.dual.steps
    ref_tensors, tensors = ref.dual.state_dict()[1], second.dual.state_dict()[1]
    assert tensors.keys() == ref_tensors.keys()
    for k in tensors:
        torch.testing.assert_close(tensors[k], ref_tensors[k], rtol=0, atol=0)


def test_sft_trainer_pair_loss_on_the_assistant_tokens(tiny_loaded, tmp_path):
    """SureSFTTrainer with ``replay_loss="pair"``: the first step's loss is the reference
    formula over each row's assistant tokens (the labels SFTTrainer's collator marks)."""
    pytest.importorskip("trl")
    from trl import SFTConfig

    from surecl.integrations.trl import SureSFTTrainer

    tok = copy.deepcopy(tiny_loaded.tokenizer)
    tok.padding_side = "right"
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }} <eos>{% endgeneration %} "
        "{% else %}{{ m['content'] }} Answer : {% endif %}{% endfor %}"
    )
    chats = [
        datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": e.sentence}, {"role": "assistant", "content": e.label}] for e in t.train]})
        for t in tiny_stream(n_train=16, n_test=1)[:1]
    ]
    args = SFTConfig(
        str(tmp_path), per_device_train_batch_size=4, learning_rate=5e-3, max_steps=1, report_to=[], use_cpu=True, bf16=False,
        save_strategy="no", disable_tqdm=True, logging_strategy="no", assistant_only_loss=True,
    )
    sft = SureSFTTrainer(model=copy.deepcopy(tiny_loaded.model), args=args, processing_class=tok, sure=SureArguments(buffer_size=8, ratio="3:2", replay_loss="pair", lora_dropout=0.0))
    seen = []
    step = sft.training_step

    def spied(model, inputs, num_items_in_batch=None):
        batch = {k: v.clone() for k, v in inputs.items()}
        assert int((batch["labels"] != -100).sum()) < int(batch["attention_mask"].sum()) - batch["labels"].shape[0]  # assistant tokens only
        with torch.no_grad():
            pair, joint, _, _ = reference_loss(sft.model, batch, int(batch["sure_new"]))
        seen.append((pair.item(), joint.item(), step(model, inputs, num_items_in_batch).item()))
        return torch.tensor(seen[-1][2])

    sft.training_step = spied
    sft.next_task(chats[0])
    (pair, joint, loss), = seen
    assert loss == pytest.approx(pair, rel=1e-5) and abs(pair - joint) > 1e-3


def test_a_process_without_rows_in_a_pair_step_adds_nothing(tiny_loaded, tmp_path, monkeypatch):
    """Under two processes a pair micro-batch of one row leaves rank 1 a padding row: weight 0
    and labels masked, so its loss (and gradient) is 0 while it still runs the forward and
    backward DDP waits for; in a joint micro-batch the padding row keeps the joint path."""
    sets = task_sets(tiny_loaded.tokenizer, n_train=8)
    trainer = trainer_for(tiny_loaded, tmp_path, SureArguments(buffer_size=4, ratio="1:2", replay_loss="pair", lora_dropout=0.0))
    trainer.sets.append(sets[0])
    monkeypatch.setattr(SureTrainer, "world", property(lambda self: 2))
    monkeypatch.setattr(SureTrainer, "rank", property(lambda self: 1))
    assert trainer._share([(0, 5, 0, 0.25)]) == [(0, 5, 2, 0.0)]
    assert trainer._share([(0, 5, 0, -1.0)]) == [(0, 5, 2, -1.0)]
    assert trainer._share([(0, 5, 0, 0.25), (0, 6, 1, 0.25), (0, 7, 1, 0.5)]) == [(0, 6, 1, 0.25)]
    from surecl.integrations.transformers import _MarkedCollator, _TaskSets

    tasks = _TaskSets(trainer.sets)
    batch = _MarkedCollator(trainer._collator())([tasks[(0, 5, 2, 0.0)]])
    assert batch["sure_new"] == 0 and batch["sure_replayed"] == 0 and batch["sure_pair_weight"].tolist() == [0.0]
    assert (batch["labels"] == -100).all()
    joint = _MarkedCollator(trainer._collator())([tasks[(0, 5, 2, -1.0)]])
    assert "sure_pair_weight" not in joint
    trainer.create_optimizer()
    loss = trainer.training_step(trainer.model, batch)
    assert loss.item() == 0.0
    assert all(p.grad is None or not p.grad.any() for p in trainer.dual.fast_params)


def test_a_non_finite_pair_loss_stops_in_one_line(tiny_loaded, tmp_path, monkeypatch):
    trainer = trainer_for(tiny_loaded, tmp_path, SureArguments(buffer_size=8, replay_loss="pair"))

    row_nll = trainer._row_nll

    def nan_rows(model, inputs, **kwargs):  # in training only (surprise scoring runs in eval mode)
        nll, count = row_nll(model, inputs, **kwargs)
        return (nll * float("nan") if model.training else nll), count

    monkeypatch.setattr(trainer, "_row_nll", nan_rows)
    with pytest.raises(SureclError, match="non-finite loss .* lower learning_rate") as err:
        trainer.next_task(task_sets(tiny_loaded.tokenizer)[0])
    assert "\n" not in str(err.value)
