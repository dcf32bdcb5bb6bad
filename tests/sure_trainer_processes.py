"""One SureTrainer script run by one process or by each of several (torch.distributed, gloo on
the CPU), for tests/test_integration_processes.py.

``python tests/sure_trainer_processes.py OUT CACHE [--sft] [--pair] [--stop TASK STEP] [--resume]`` trains the
tiny model (from the model cache CACHE, built beforehand) on three tiny tasks with SuRe, and
each process writes what it ended with to ``OUT/rank<r>.json`` (buffer, scores, replay
counts, EMA clock, eval losses after every task, what it scored and trained on, the state
files it wrote) and ``OUT/rank<r>.safetensors`` (the fast and slow adapters). With ``--sft`` the
script is a TRL one: :class:`surecl.integrations.trl.SureSFTTrainer` on chat rows, the loss on
the assistant turns (``assistant_only_loss``). With ``--pair`` the Trainer script weights
replayed rows by the paper's pair loss (``replay_loss="pair"``, whose weights span the whole
optimizer step: both micro-batches of both processes) and ages the replayed entries
(``aging=True``: re-scored after every step that replays, sharded and gathered), without
gradient clipping, so the gradient norm each process records before every optimizer step
(after DDP's all-reduce) is the step's whole gradient, which the one-process run must match.

The global batch is the same whatever the number of processes: ``MICRO`` examples a
micro-batch over all processes (``per_device_train_batch_size = MICRO / W``), ``GA``
micro-batches an optimizer step. Each process evaluates its share of a test set in one batch
(``per_device_eval_batch_size = N_TEST / W``), so the Trainer's ``eval_loss``, normalised by
the token count over all processes, is the token mean over the whole set whatever W is (with
several batches per process it pairs batches across processes, and its value depends on W).
LoRA dropout is off (masks are drawn per process, so with dropout the runs would agree in
distribution only). ``--stop TASK STEP`` stops every process after optimizer step STEP of task
TASK (an exception from a callback, before any later checkpoint); ``--resume`` reruns the
script with ``resume_from_checkpoint=True``. ``--save-only`` saves checkpoints without the
optimizer (``save_only_model``); ``--slow-end S`` makes the main process take S seconds more to
write each task's end state; ``--no-eval`` leaves out the evaluations between tasks. Every optimizer step
logs (``logging_steps=1``); what each log says of the trained tokens is kept."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
from pathlib import Path

TASKS, N_TRAIN, N_TEST = 3, 17, 16
MICRO, GA = 4, 2
"""17 new examples a task make micro-batches 4, 4, 4, 4, 1 and optimizer steps of 8, 8 and 1
(the last a single micro-batch). Replay 1:2, counted over the task's steps (8, 8, 1, 8, 8, 1
new: floor of half the running total), adds 4, 4, 0, 4, 4, 1 rows: the first epoch's last
micro-batch keeps one row, so with two processes one of them has none of it and runs a
padding row."""
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }} <eos>{% endgeneration %} "
    "{% else %}{{ m['content'] }} Answer : {% endif %}{% endfor %}"
)
SURE = dict(buffer_size=9, ratio="1:2", unit="example", beta=0.9, bias_correction=True, lora_dropout=0.0, score_time="before", insert_time="before")


class Stop(Exception):
    pass


def exit_record(out: Path, rank: str) -> None:
    """At exit (registered first, so after the library's own exit handlers): whether the
    torch.distributed group was still up, in ``OUT/exit<rank>.json``."""
    import torch.distributed as dist

    if out.is_dir():
        (out / f"exit{rank}.json").write_text(json.dumps({"group_up": dist.is_initialized()}))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("cache")
    parser.add_argument("--stop", nargs=2, type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--sft", action="store_true")
    parser.add_argument("--pair", action="store_true")
    parser.add_argument("--save-only", action="store_true", help="checkpoints without the optimizer (save_only_model=True)")
    parser.add_argument("--slow-end", type=float, default=0.0, help="the main process takes this many seconds more to write a task's end")
    parser.add_argument("--no-eval", action="store_true", help="no evaluation between tasks (a collective that lines the processes up)")
    opts = parser.parse_args(argv)
    atexit.register(exit_record, Path(opts.out), os.environ.get("RANK", "0"))

    import datasets
    import torch
    from safetensors.torch import save_file
    from trainer_stops import StopAt
    from transformers import DataCollatorForLanguageModeling, PrinterCallback, TrainerCallback, TrainingArguments

    from surecl.config import ModelConfig
    from surecl.data.tiny import tiny_stream
    from surecl.integrations.transformers import SureArguments, SureTrainer
    from surecl.model import load_model

    world = int(os.environ.get("WORLD_SIZE", "1"))
    loaded = load_model(ModelConfig(name="tiny"), torch.device("cpu"), Path(opts.cache))
    tok = loaded.tokenizer
    # right padding: the model numbers positions from 0 in every row, so a row's loss does not
    # depend on which rows share its batch (with left padding and no position_ids it does, and
    # the processes' batches are other rows than the one process's)
    tok.padding_side = "right"

    def encode(rows):
        if opts.sft:
            return datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": e.sentence}, {"role": "assistant", "content": e.label}] for e in rows]})
        ds = datasets.Dataset.from_dict({"text": [f"{e.sentence} Answer: {e.label}" for e in rows]})
        return ds.map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])

    stream = tiny_stream(n_train=N_TRAIN, n_test=N_TEST)[:TASKS]
    train, test = [encode(t.train) for t in stream], [encode(t.test) for t in stream]
    settings = dict(
        per_device_train_batch_size=MICRO // world, gradient_accumulation_steps=GA,
        per_device_eval_batch_size=N_TEST // world, learning_rate=5e-3, num_train_epochs=2, lr_scheduler_type="constant",
        report_to=[], use_cpu=True, save_strategy="steps", save_steps=2, seed=0, disable_tqdm=True, logging_steps=1,
        save_only_model=opts.save_only,
    )
    if opts.sft:
        from trl import SFTConfig

        from surecl.integrations.trl import SureSFTTrainer

        tok.chat_template = CHAT_TEMPLATE
        args = SFTConfig(str(Path(opts.out) / "run"), assistant_only_loss=True, bf16=False, **settings)
        trainer = SureSFTTrainer(model=loaded.model, args=args, processing_class=tok, sure=SureArguments(**SURE))
    else:
        if opts.pair:
            settings["max_grad_norm"] = 0.0
        args = TrainingArguments(str(Path(opts.out) / "run"), **settings)
        sure = SureArguments(**SURE, **(dict(replay_loss="pair", aging=True) if opts.pair else {}))
        trainer = SureTrainer(model=loaded.model, args=args, data_collator=DataCollatorForLanguageModeling(tok, mlm=False), sure=sure)
    trainer.remove_callback(PrinterCallback)
    rank = trainer.args.process_index
    record = {"world": trainer.world, "scored": [], "rows": [], "padding_rows": 0, "state_writes": [], "evals": [], "grad_norms": [], "logged_tokens": []}

    surprise = trainer._surprise

    def spied_surprise(dataset, indices):
        record["scored"].append(len(indices))
        return surprise(dataset, indices)

    trainer._surprise = spied_surprise
    share = trainer._share

    def spied_share(micro):
        rows = share(micro)
        record["rows"].append(len(rows))
        record["padding_rows"] += sum(1 for row in rows if row[2] == 2)
        return rows

    trainer._share = spied_share
    write = trainer._write_state

    def spied_write(folder, done):
        record["state_writes"].append(str(Path(folder).relative_to(opts.out)))
        if done and opts.slow_end and rank == 0:
            import time

            time.sleep(opts.slow_end)
        return write(folder, done)

    trainer._write_state = spied_write

    class GradNorm(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            record["grad_norms"].append(float(torch.cat([p.grad.flatten() for p in trainer.dual.fast_params]).norm()))

    class Logged(TrainerCallback):  # what every step's log says (TRL's num_tokens with --sft)
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                record["logged_tokens"].append(logs.get("num_tokens"))

    trainer.add_callback(GradNorm())
    trainer.add_callback(Logged())
    if opts.stop:
        trainer.add_callback(StopAt(*opts.stop, error=Stop))
    try:
        for t in range(TASKS):
            if trainer.next_task(train[t], resume_from_checkpoint=True if opts.resume else None) is not None and not opts.no_eval:
                record["evals"].append([trainer.evaluate(d)["eval_loss"] for d in test] + [trainer.evaluate(test[t], adapter="fast")["eval_loss"]])
    except Stop:
        return
    record.update(
        buffer=trainer.policy.buffer.state_dict(), scores={str(k): v for k, v in trainer.scores.items()},
        replay_counts={str(k): v for k, v in trainer.replay_counts.items()}, ema=[trainer.dual.beta, trainer.dual.steps, trainer.dual.updates],
        resumed_from=trainer.resumed_from and str(Path(trainer.resumed_from).relative_to(opts.out)),
        num_tokens=getattr(trainer, "_total_train_tokens", None),
    )
    out = Path(opts.out)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    save_file(trainer.dual.state_dict()[1], str(out / f"rank{rank}.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1:])
