"""One setting run twice: by ``surecl run`` (``ContinualRun``) and by a user's ``transformers``
Trainer script with :class:`surecl.integrations.transformers.SureTrainer`, for
tests/test_integration_agreement.py and bench/trainer_agreement.py (which prints the per-seed
numbers the test's tolerance comes from).

The two runs share the data (the Trainer script takes the core run's own encoded examples,
prompt + answer, with labels on the answer tokens), the settings and the evaluation (the
core's greedy generation + exact match on each task's test split, the slow adapter
answering). Settings that map one to one:

* ``train.lr`` / ``batch_size`` / ``epochs`` = ``learning_rate`` / ``per_device_train_batch_size``
  / ``num_train_epochs``; ``train.scheduler=constant`` = ``lr_scheduler_type="constant"``;
  ``train.grad_clip`` = ``max_grad_norm``; the core's ``torch.optim.AdamW`` = ``optim="adamw_torch"``;
  ``train.fresh_optimizer=true`` (the Trainer starts every task with a fresh AdamW);
* ``train.batching=uniform`` (the integration orders new examples by the core's uniform
  batches from the same seed, so both take the same batches in the same order);
* ``replay.scope=label`` (the integration's surprise is the NLL over the tokens the labels
  mark: here the answer, as the core's training loss);
* ``model.share_prefix=false`` (the core would run a batch's shared prompt prefix once: the
  same result up to float summation order);
* LoRA r / alpha / dropout / targets, ``dual.beta`` / ``bias_correction`` / ``unit``,
  ``replay.buffer_size`` / ``ratio`` / timing, ``seed``;
* ``replay.loss`` = ``SureArguments.replay_loss`` (``joint`` by default; ``pair``: the paper's
  pair weighting on both sides).

What still differs is float arithmetic only: the Trainer right-pads and lets the model build
the loss, the core left-pads with explicit positions and sums the answer NLL itself.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

TASKS = ["colors", "animals", "numbers"]
N_TRAIN, N_TEST, EPOCHS, BATCH, LR = 32, 24, 8, 8, 3e-3
BUFFER, RATIO, BETA = 12, "1:2", 0.9
LORA = dict(r=8, alpha=16, dropout=0.0, targets=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"])


def core_overrides(seed: int, replay_loss: str = "joint") -> list[str]:
    return [
        f"seed={seed}", f"data.tasks=[{','.join(TASKS)}]", f"data.n_train={N_TRAIN}", f"data.n_test={N_TEST}",
        f"train.epochs={EPOCHS}", f"train.batch_size={BATCH}", f"train.lr={LR}", "train.batching=uniform", "train.fresh_optimizer=true",
        "train.scheduler=constant", "train.grad_clip=1.0", "train.checkpoint_every=0", "model.share_prefix=false",
        f"replay.buffer_size={BUFFER}", f"replay.ratio='{RATIO}'", "replay.scope=label", "replay.reduction=mean",
        f"dual.beta={BETA}", "dual.bias_correction=true", "dual.unit=step", "eval.before=false",
        f"lora.r={LORA['r']}", f"lora.alpha={LORA['alpha']}", f"lora.dropout={LORA['dropout']}",
        f"lora.target_modules=[{','.join(LORA['targets'])}]", f"replay.loss={replay_loss}",
    ]


def core_run(seed: int, out: Path, cache: Path, replay_loss: str = "joint"):
    """``surecl run --config tiny,slow_surprise`` with the setting's overrides: the finished
    ``ContinualRun`` (its ``train_sets`` / ``test_sets`` feed :func:`trainer_run`) and its results."""
    from surecl.config import build_config
    from surecl.trainer import ContinualRun

    cfg = build_config("tiny,slow_surprise", core_overrides(seed, replay_loss))
    run = ContinualRun(cfg, out, progress=False, cache_dir=cache)
    results = run.run()
    return run, results


def answer_rows(items) -> dict:
    """Encoded examples as a user's tokenised dataset: prompt + answer ids, labels on the answer."""
    import datasets

    return datasets.Dataset.from_dict({
        "input_ids": [e.prompt + e.answer for e in items],
        "labels": [[-100] * len(e.prompt) + e.answer for e in items],
    })


def right_pad_collator(pad_id: int):
    """The usual training collator: right padding, labels -100 on padding."""

    def collate(rows):
        n = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), n), pad_id)
        labels = torch.full((len(rows), n), -100)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for k, r in enumerate(rows):
            m = len(r["input_ids"])
            ids[k, :m] = torch.tensor(r["input_ids"])
            labels[k, :m] = torch.tensor(r["labels"])
            mask[k, :m] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return collate


def trainer_run(seed: int, out: Path, core, base_model, order_seed: int | None = None, replay_loss: str = "joint"):
    """The same setting as a Trainer script: one ``next_task`` per task on the core run's
    encoded training examples, the core's evaluation after each task on the slow adapter.
    Returns the trainer and its accuracy matrix (rows: after task i; columns: task j).
    ``order_seed``: order the new examples by the uniform batches of this seed instead (the
    same run but for the batch order: what the order alone moves)."""
    from transformers import PrinterCallback, TrainingArguments

    from surecl.evaluate import generate_answers, task_score
    from surecl.integrations.transformers import SureArguments, SureTrainer

    args = TrainingArguments(
        str(out), per_device_train_batch_size=BATCH, num_train_epochs=EPOCHS, learning_rate=LR, lr_scheduler_type="constant",
        max_grad_norm=1.0, optim="adamw_torch", weight_decay=0.0, seed=seed, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, logging_strategy="no",
    )
    sure = SureArguments(
        buffer_size=BUFFER, policy="surprise", ratio=RATIO, beta=BETA, bias_correction=True, unit="step", replay_loss=replay_loss,
        lora_r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"], target_modules=list(LORA["targets"]),
    )
    tok = core.tokenizer
    trainer = SureTrainer(model=copy.deepcopy(base_model), args=args, data_collator=right_pad_collator(tok.pad_token_id), sure=sure)
    trainer.remove_callback(PrinterCallback)  # no train summary on stdout
    if order_seed is not None:
        trainer._orders = lambda t: _other_orders(trainer, t, order_seed)
    matrix = []
    for t in range(len(TASKS)):
        trainer.next_task(answer_rows(core.train_sets[t]))
        row = []
        with trainer.slow_weights() as model:
            for j in range(len(TASKS)):
                items = core.test_sets[j]
                new_tokens = max(len(a) for a in core.label_answers[j].values()) + 1
                answers = generate_answers(model, tok, items, is_seq2seq=False, max_new_tokens=new_tokens, batch_size=64, device=torch.device("cpu"), share_prefix=False)
                row.append(task_score(core.tasks[j].score_metric, answers, [e.label for e in items]))
        matrix.append(row)
    return trainer, matrix


def _other_orders(trainer, t: int, order_seed: int):
    seed = trainer.args.seed
    trainer.args.seed = order_seed
    try:
        return type(trainer)._orders(trainer, t)
    finally:
        trainer.args.seed = seed


def base_model(cache: Path):
    """The tiny base model as the core loads it (a fresh copy for the Trainer script)."""
    from surecl.config import ModelConfig
    from surecl.model import load_model

    return load_model(ModelConfig(name="tiny", max_length=64), torch.device("cpu"), cache).model


def final_fp(matrix) -> float:
    """FP: the mean accuracy over every task after the last one."""
    return sum(matrix[-1]) / len(matrix[-1])


def compare(seed: int, root: Path, cache: Path, order_seed: int | None = None, replay_loss: str = "joint") -> dict:
    """Both runs of ``seed``: their matrices, FP, buffers and EMA clocks (``order_seed``: and the
    Trainer script again with the new examples in another order), both with ``replay.loss``
    ``replay_loss``."""
    core, results = core_run(seed, root / f"core-{replay_loss}-{seed}", cache, replay_loss)
    base = base_model(cache)
    trainer, matrix = trainer_run(seed, root / f"trainer-{replay_loss}-{seed}", core, base, replay_loss=replay_loss)
    other = None
    if order_seed is not None:
        other = trainer_run(seed, root / f"trainer-{replay_loss}-{seed}-order", core, base, order_seed, replay_loss)[1]
    return {
        "other_order_matrix": other, "other_order_fp": None if other is None else final_fp(other),
        "core_matrix": results["accuracy_matrix"], "trainer_matrix": matrix,
        "core_fp": final_fp(results["accuracy_matrix"]), "trainer_fp": final_fp(matrix),
        "core_buffer": core.policy.buffer.state_dict(), "trainer_buffer": trainer.policy.buffer.state_dict(),
        "core_ema": (core.adapters.beta, core.adapters.steps, core.adapters.updates),
        "trainer_ema": (trainer.dual.beta, trainer.dual.steps, trainer.dual.updates),
        "core": core, "trainer": trainer,
    }
