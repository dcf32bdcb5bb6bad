"""A plain ``transformers`` Trainer script with SureTrainer beside ``surecl run`` on the embedded
default stream (SmolLM2-135M, newsgroups/tweets/reuters/movies, slow_surprise): the score
matrix, FP and wall time of each (issue 29's measured run; RESULTS.md).

The core run is the default ``surecl run`` with the settings a Trainer script cannot change
aligned to it (see tests/trainer_agreement.py for why each is needed):
``train.fresh_optimizer=true`` (the Trainer makes a fresh AdamW per ``train()``),
``replay.scope=label`` (the integration scores the tokens its labels mark),
``model.share_prefix=false``, no checkpoints and no before-training row. Everything else is the
default: lr 0.002 constant, batch 8 uniform, one epoch, buffer 2 % of the stream, 4 replayed
every 2 steps, EMA beta auto (a window of half a task) per step, bias-corrected; the Trainer
script gets the same values through ``TrainingArguments`` / ``SureArguments``, the core's
encoded examples (prompt + answer, labels on the answer) and, after each task, the core's
evaluation (greedy generation, exact match on the label) under its slow adapter.

Wall time: each side's training + scoring (``timing.train + timing.score`` of the core's
results.json; the ``next_task`` calls of the Trainer script), and its evaluation, measured
one after the other in one process on one machine.

Usage (from the repository root; about 20 + 20 minutes at one thread on machine B alone):
  OMP_NUM_THREADS=1 PYTHONPATH=src python bench/trainer_embedded.py --seed 0 [--json out.json]
The core run keeps checkpoints in ``--out`` (default runs/trainer-embedded-s<seed>/core) and
resumes after a stop; the Trainer script's numbers are kept in ``<out>/trainer.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import script

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from trainer_agreement import answer_rows, right_pad_collator  # noqa: E402

ALIGN = ["train.fresh_optimizer=true", "replay.scope=label", "model.share_prefix=false", "train.checkpoint_every=0",
         "eval.before=false"]
"""What the core run changes of the default run to match what a Trainer script does (stage-end
checkpoints only)."""


def core_run(seed: int, out: Path, config: str = "slow_surprise", extra: list[str] | None = None):
    from surecl.config import build_config
    from surecl.trainer import ContinualRun

    cfg = build_config(config, [f"seed={seed}", *ALIGN, *(extra or [])])
    run = ContinualRun(cfg, out, progress=False)
    return run, run.run()


def trainer_run(seed: int, out: Path, core) -> dict:
    """The same stream and settings as a Trainer script (one ``next_task`` per task)."""
    from transformers import PrinterCallback, TrainingArguments

    from surecl.evaluate import generate_answers, task_score
    from surecl.integrations.transformers import SureArguments, SureTrainer
    from surecl.model import default_cache_dir, load_model

    cfg = core.cfg
    assert cfg.train.scheduler == "constant" and cfg.train.warmup_steps == 0
    args = TrainingArguments(
        str(out), per_device_train_batch_size=cfg.train.batch_size, num_train_epochs=cfg.train.epochs,
        learning_rate=cfg.train.lr, lr_scheduler_type="constant", max_grad_norm=cfg.train.grad_clip or 0.0,
        optim="adamw_torch", weight_decay=cfg.train.weight_decay, seed=seed, save_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, logging_strategy="no",
    )
    rp = cfg.replay
    sure = SureArguments(
        buffer_size=core.policy.buffer.capacity, policy=rp.policy, score_time=rp.score_time, insert_time=rp.insert_time,
        reduction=rp.reduction, ratio=rp.ratio, replay_every=rp.every, replay_batch_size=rp.batch_size,
        beta=cfg.dual.beta, window_tasks=cfg.dual.window_tasks, bias_correction=cfg.dual.bias_correction, unit=cfg.dual.unit,
        lora_r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout, target_modules=list(cfg.lora.target_modules),
    )
    base = load_model(cfg.model, torch.device("cpu"), default_cache_dir()).model
    tok = core.tokenizer
    trainer = SureTrainer(model=base, args=args, data_collator=right_pad_collator(tok.pad_token_id), sure=sure)
    trainer.remove_callback(PrinterCallback)
    matrix, train_s, eval_s = [], 0.0, 0.0
    n = len(core.tasks)
    for t in range(n):
        start = time.perf_counter()
        trainer.next_task(answer_rows(core.train_sets[t]))
        train_s += time.perf_counter() - start
        start = time.perf_counter()
        row = []
        with trainer.slow_weights() as model:
            for j in range(n):
                if j > t:
                    row.append(None)
                    continue
                items = core.test_sets[j]
                new_tokens = max(len(a) for a in core.label_answers[j].values()) + 1
                answers = generate_answers(model, tok, items, is_seq2seq=False, max_new_tokens=new_tokens,
                                           batch_size=cfg.eval.batch_size, device=torch.device("cpu"), share_prefix=False)
                row.append(task_score(core.tasks[j].score_metric, answers, [e.label for e in items]))
        eval_s += time.perf_counter() - start
        matrix.append(row)
        print(f"trainer script after {core.tasks[t].name}: " + ", ".join(f"{v:.1f}" for v in row if v is not None), file=sys.stderr)
    fp = sum(matrix[-1]) / n
    ap = sum(matrix[i][i] for i in range(n)) / n
    return {"matrix": matrix, "fp": fp, "ap": ap, "train_s": train_s, "eval_s": eval_s,
            "buffer": [(e["task"], e["index"]) for e in trainer.policy.buffer.state_dict()["entries"]],
            "ema": [trainer.dual.beta, trainer.dual.steps, trainer.dual.updates]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument("--out", type=Path, help="where the two runs keep their state (default runs/trainer-embedded-s<seed>): "
                    "rerun the same command after a stop and the core run resumes from its checkpoints, a finished "
                    "Trainer script is read back")
    ap.add_argument("--config", default="slow_surprise", help="presets of the core run (default: the default run's); "
                    "'tiny,slow_surprise' with data.tasks=[colors,animals] checks the script in a minute")
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the core run (the Trainer script follows them)")
    args = ap.parse_args()
    from surecl.model import host_info
    from surecl.report import host_key

    out_dir = args.out or Path("runs") / f"trainer-embedded-s{args.seed}"
    core, res = core_run(args.seed, out_dir / "core", args.config, args.overrides)  # resumes from its checkpoints
    done = out_dir / "trainer.json"
    if done.is_file():
        tr = json.loads(done.read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            tr = trainer_run(args.seed, Path(tmp) / "trainer", core)
        from surecl.checkpoint import write_text

        write_text(done, json.dumps(tr))
    timing = res["timing"]
    core_buffer = [(e["task"], e["index"]) for e in core.policy.buffer.state_dict()["entries"]]
    out = {
        "seed": args.seed, "tasks": res["tasks"], "host": host_info(torch.device("cpu")), "torch_threads": torch.get_num_threads(),
        "core": {"matrix": res["accuracy_matrix"], "fp": res["fp"], "ap": res["ap"],
                 "train_s": timing["train"] + timing["score"], "eval_s": timing["eval"],
                 "ema": [core.adapters.beta, core.adapters.steps, core.adapters.updates]},
        "trainer": {k: v for k, v in tr.items() if k != "buffer"},
        "same_buffer": sorted(core_buffer) == sorted(tuple(x) for x in tr["buffer"]),
    }
    out["host_key"] = host_key({"host": out["host"]})
    fmt = lambda row: " | ".join("-" if v is None else f"{v:.1f}" for v in row)  # noqa: E731
    print(f"host: {out['host_key']}, torch threads {out['torch_threads']}, seed {args.seed}")
    print("| run | after | " + " | ".join(res["tasks"]) + " |")
    print("|---|---|" + "---|" * len(res["tasks"]))
    for name, m in (("surecl run", out["core"]["matrix"]), ("Trainer script", tr["matrix"])):
        for i, row in enumerate(m):
            print(f"| {name} | {res['tasks'][i]} | {fmt(row)} |")
    for name in ("core", "trainer"):
        o = out[name]
        print(f"{name}: FP {o['fp']:.1f}  AP {o['ap']:.1f}  train+score {o['train_s']:.0f} s  eval {o['eval_s']:.0f} s  "
              f"EMA (beta, steps, updates) {tuple(round(x, 4) for x in o['ema'])}")
    print(f"same buffer members: {out['same_buffer']}")
    if args.json:
        from surecl.checkpoint import write_text

        write_text(args.json, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    script(main)
