"""Evaluation of a run (:class:`surecl.trainer.ContinualRun`, ``run`` below): a task's score
under the weights the plugins' ``eval_context`` choose, the rows of the score matrix (the
before-training row, each stage's row and a dual run's fast row) and the general-ability
probe. Each function takes the run as its first argument and reads what
:class:`~surecl.plugins.base.RunContext` lists, plus the run's ``state``, ``predictions`` and
``label_answers``."""

from __future__ import annotations

import time

from tqdm.auto import tqdm

from surecl.data.encode import Encoded, new_token_budget  # (the budget lives beside the encoder: card.py reads it too)
from surecl.data.task import Task
from surecl.evaluate import generate_answers, instance_rows, instances, perplexity, rank_answers, task_score
from surecl.plugins.base import GENERAL_PROBE, Stage
from surecl.replay.surprise import score_examples
from surecl.run_state import release_memory


def evaluate_task(run, j: int, method_weights: bool = True, adapter: str | None = None) -> float:
    """Accuracy (percent) on task ``j``'s test split, or its perplexity for text streams,
    inside every plugin's ``eval_context`` (without the method's, nor its input prefix, when
    not ``method_weights``: the learner's own weights, e.g. not per-task FT's snapshot nor
    Progressive Prompts' prompts), asking for ``adapter`` (``run.eval_view``; default: the
    evaluation adapter, slow if dual)."""
    return _under(run, adapter, () if method_weights else (run.method,), j,
                  lambda: score_task(run, run.tasks[j], run.test_sets[j], j))


def _under(run, adapter: str | None, left_out: tuple, task: int, measure):
    """``measure()`` inside the plugins' ``eval_context`` for ``task`` but ``left_out``'s,
    with ``run.eval_view`` = ``adapter`` and ``run.left_out`` = ``left_out`` meanwhile."""
    run.eval_view, run.left_out = adapter, left_out
    try:
        with run.plugins.eval_context(run, task, skip=left_out):
            return measure()
    finally:
        run.eval_view, run.left_out = None, ()


def encode_test(cfg, encoder, task: Task, train: list[Encoded]) -> list[Encoded]:
    """``task``'s test rows as evaluation reads them (``train``: its encoded training rows).
    Under ``eval.answer_budget=train`` a generation task's prompts are all cut to leave room for
    its answer budget (:func:`new_token_budget`; a task without training rows reads its own
    targets for it first), so neither a row's input nor its answer depends on its own or
    another row's reference; under ``references`` each prompt leaves room for its own target."""
    if task.kind != "generate" or cfg.eval.answer_budget == "references":
        return encoder.encode(task, task.test, split="test")
    own = [] if train or cfg.eval.max_new_tokens else encoder.encode(task, task.test, split="test")
    return encoder.encode(task, task.test, split="test", reserve=new_token_budget(cfg, task, own, None, train))


def score_task(run, task: Task, items: list[Encoded], j: int | None = None) -> float:
    """``task``'s score on its encoded test rows ``items``: perplexity for a text task, else
    its metric of the answers (``j``: the stream task's index, whose label answers ranking
    reads and whose answers ``predictions.jsonl`` records; None for the general probe)."""
    model = run.accelerator.unwrap_model(run.model)
    cfg, bs, pad, device = run.cfg, run.cfg.eval.batch_size, run.tokenizer.pad_token_id, run.device
    if task.kind == "text":
        nll = run.sharded(
            lambda part: score_examples(
                model, part, pad_id=pad, is_seq2seq=False, scope="label", reduction="sum", batch_size=bs, device=device,
                share_prefix=run.share_prefix,
            ),
            items,
        )
        return perplexity(nll, [len(e.answer) for e in items])
    train = run.train_sets.encoded[j] if j is not None else ()  # the probe's tasks have no training rows
    new_tokens = new_token_budget(cfg, task, items, run.label_answers[j] if j is not None else None, train)
    if task.kind == "generate":  # free text, whatever eval.mode says of the labelled tasks
        predict = lambda part: generate_answers(  # noqa: E731
            model, run.tokenizer, part, is_seq2seq=run.is_seq2seq, max_new_tokens=new_tokens, batch_size=bs, device=device,
            share_prefix=run.share_prefix, stop_ids=run.stop_ids,
        )
    elif cfg.eval.mode == "rank":
        answers = run.label_answers[j]
        predict = lambda part: rank_answers(  # noqa: E731
            model, part, answers, pad_id=pad, is_seq2seq=run.is_seq2seq, batch_size=bs, device=device, share_prefix=run.share_prefix,
        )
    else:
        predict = lambda part: generate_answers(  # noqa: E731
            model, run.tokenizer, part, is_seq2seq=run.is_seq2seq, max_new_tokens=new_tokens, batch_size=bs, device=device,
            share_prefix=run.share_prefix,
        )
    keys = None  # eval.references=max: a generation task's rows sharing an input are one instance (classification: each row alone)
    if task.kind == "generate" and cfg.eval.references == "max":
        keys = instances(task.test)
        answering = instance_rows(keys, [e.prompt for e in items])  # one greedy answer per instance, given to each of its rows
        answers = dict(zip(answering, run.sharded(predict, [items[k] for k in answering.values()])))
        predictions = [answers[key] for key in keys]
    else:
        predictions = run.sharded(predict, items)
    if j is not None and run.eval_view is None and not run.left_out:  # the run's evaluation adapter: what predictions.jsonl records
        run.predictions[j] = predictions
    return task_score(task.score_metric, predictions, [e.label for e in items], task.labels, instances=keys)


def before_training(run) -> bool:
    """What is measured before any training and not yet (a resumed run measured it already):
    the before-training row (``eval.before``, then the plugins' ``after_eval`` with stage None)
    and the general probe's first values. True when anything was (the run then checkpoints)."""
    before = run.cfg.eval.before and run.state.initial is None
    probing = run.general is not None and run.state.general_initial is None
    if before:
        evaluate_before(run)
    if probing:
        evaluate_general(run, None)
    if before:
        run.plugins.after_eval(run, None)
    return before or probing


def evaluate_before(run) -> None:
    """The before-training row: every task under the initial weights (base + zero LoRA)."""
    start = time.perf_counter()
    run.state.initial = [round(evaluate_task(run, j, method_weights=False), 4) for j in range(len(run.tasks))]
    run.state.seconds["eval"] += time.perf_counter() - start
    run.log("before training: " + ", ".join(f"{t.name} {v:.1f}" for t, v in zip(run.tasks, run.state.initial)))


def evaluate_stage(run, stage: Stage) -> None:
    """Row ``stage.row`` of the matrix (and of the fast matrix with ``eval.fast``), and the last
    stage's answers for ``predictions.jsonl``."""
    start = time.perf_counter()
    row = run.state.accuracy[stage.row]
    wanted = evaluated(run, stage)
    for j in tqdm(wanted, desc="eval", disable=not run.progress or not run.accelerator.is_main_process, leave=False):
        row[j] = round(evaluate_task(run, j), 4)
    if stage is run.stages[-1] and run.cfg.eval.mode != "perplexity":
        run.state.predictions = {run.tasks[j].name: run.predictions[j] for j in wanted}
    fast = None
    if run.eval_fast:  # the same trajectory's fast adapter: the non-dual method's row
        fast = run.state.accuracy_fast[stage.row]
        for j in wanted:
            fast[j] = round(evaluate_task(run, j, adapter="fast"), 4)
    release_memory()
    run.state.seconds["eval"] += time.perf_counter() - start
    shown = ", ".join(f"{run.tasks[j].name} {row[j]:.1f}" for j in wanted)
    if fast is not None:
        shown += " (fast: " + ", ".join(f"{fast[j]:.1f}" for j in wanted) + ")"
    run.log(f"after {run.stage_name(stage)}: {shown}")


def evaluate_general(run, stage: Stage | None) -> None:
    """The general-ability probe under the learner's weights (the evaluation adapter and the
    frozen adapters beside it; not a method's per-task snapshot nor its input prefix, which
    belong to a stream task), before any training (``stage`` None) or after ``stage``; with
    ``eval.fast`` in a dual run, under the fast adapter too."""
    start = time.perf_counter()
    values = probe(run)
    if stage is None:
        run.state.general_initial = values
    else:
        run.state.general[stage.row] = values
        if run.state.general_fast is not None:
            run.state.general_fast[stage.row] = probe(run, "fast")
    release_memory()
    run.state.seconds["general"] = run.state.seconds.get("general", 0.0) + time.perf_counter() - start
    when = "before training" if stage is None else f"after {run.stage_name(stage)}"
    run.log(f"general ability {when}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))


def probe(run, adapter: str | None = None) -> dict[str, float]:
    """Each probe part's value under ``adapter`` (default: the evaluation adapter)."""
    return _under(run, adapter, (run.method,), GENERAL_PROBE,
                  lambda: {t.name: round(score_task(run, t, items), 4) for t, items in zip(run.general.tasks, run.general_sets)})


def evaluated(run, stage: Stage) -> list[int]:
    """The tasks evaluated after ``stage``: all it names, or with ``eval.matrix=fp_ap`` only
    its own task until the last stage (the diagonal and the final row)."""
    if run.cfg.eval.matrix == "fp_ap" and stage is not run.stages[-1]:
        wanted = [j for j in stage.evaluate if j == stage.row] or list(stage.evaluate)
    else:
        wanted = list(stage.evaluate)
    ahead = stage.row + 1
    if run.cfg.eval.ahead and run.method.continual and ahead < len(run.tasks) and ahead not in wanted:
        wanted.append(ahead)  # the next task, not trained yet: forward transfer's cell
    return wanted
