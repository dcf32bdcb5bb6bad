"""What a finished run (:class:`surecl.trainer.ContinualRun`, ``run`` below) reports: the
``results.json`` dict (matrix, summary metrics, the general probe, the buffer, provenance,
timing), ``predictions.jsonl``'s rows, the comment ``config.yaml`` starts with when the model or
tasks came from Python, and :func:`finish`: every final output written as one transaction."""

from __future__ import annotations

import json

import surecl.checkpoint as checkpoint
import surecl.metrics as metrics
from surecl.evaluate import is_label, task_score
from surecl.methods.base import learner_of
from surecl.plugins.faults import fault_point
from surecl.processes import agreed
from surecl.run_eval import evaluate_task, evaluated

SUPPLIED_NOTE = "supplied in Python: config.yaml alone does not rerun it"
"""What results.json, config.yaml and the model cards say of a model or tasks passed to the run."""


def majority_rate(task) -> float | None:
    """The share (%) of the task's test rows whose gold label is its most frequent one: the
    accuracy of always answering that label, against which "learned" is judged."""
    if not task.test or task.kind != "classify":
        return None
    counts: dict[str, int] = {}
    for ex in task.test:
        counts[ex.label] = counts.get(ex.label, 0) + 1
    return 100.0 * max(counts.values()) / len(task.test)


def metrics_of_tasks(run) -> dict[str, str]:
    """Each task's metric, the unit of its column of the score matrix (:func:`surecl.metrics.task_metrics`)."""
    return metrics.task_metrics(run.tasks, run.cfg.eval.mode)


def results(run) -> dict:
    """``results.json``'s dict."""
    st = run.state
    lower = run.cfg.eval.mode == "perplexity"
    summary = metrics.summarise(st.accuracy, higher_is_better=not lower, initial=st.initial)
    blank = {} if run.method.continual else dict(ap=None, forgetting=None, bwt=None, avg_incremental=None, fwt=None)
    summary.update(blank)  # MTL: one row, no forgetting to measure (nor for its fast adapter)
    extra = {}
    if st.accuracy_fast is not None:
        extra["fast"] = {"accuracy_matrix": st.accuracy_fast,
                         **metrics.summarise(st.accuracy_fast, higher_is_better=not lower, initial=st.initial), **blank}
    per_task = metrics_of_tasks(run)
    kinds = set(per_task.values())
    return {
        "tasks": [t.name for t in run.tasks],
        # one name when every task shares it (accuracy, perplexity, rouge_l, exact_match), else "mixed"
        "metric": kinds.pop() if len(kinds) == 1 else "mixed",
        "metrics": per_task,
        "accuracy_matrix": st.accuracy,
        "initial": st.initial,
        "majority": None if lower else {t.name: majority_rate(t) for t in run.tasks},
        **summary,
        **extra,
        **({"general": general_results(run)} if run.general is not None else {}),
        "learner": learner_of(run.method),
        "buffer": {"capacity": run.policy.capacity, "size": len(run.policy), "per_task": buffer_counts(run),
                   "labels": buffer_labels(run)},
        "config": run.cfg.to_dict(),
        "timing": {k: round(v, 3) for k, v in st.seconds.items()},
        "steps": st.global_step,
        "dual_beta": run.adapters.beta if run.cfg.dual.enabled else None,
        "model_path": run.model_path,
        "base_dtype": run.base_dtype,
        "device": str(run.device),
        "provenance": provenance(run),
        "host": st.hosts[-1],  # the run added this machine before any results
        "hosts": st.hosts,
    }


def general_results(run) -> dict | None:
    """results.json's ``general``: the probe's source, parts, their metrics and sizes, the values
    before training (``before``), after each stage (``after``, one entry per matrix row), after
    the last (``final``) and ``change`` = final - before per part (a perplexity that rose, or a
    score that fell, is what the stream cost); ``fast``: the same under the fast adapter."""
    if run.general is None:
        return None
    st = run.state

    def summary(rows: list[dict[str, float] | None]) -> dict:
        final = next((r for r in reversed(rows) if r is not None), None)
        before = st.general_initial or {}
        change = {k: round(final[k] - before[k], 4) for k in final if k in before} if final else None
        return {"after": rows, "final": final, "change": change}

    out = {"source": run.general.source, "parts": run.general.names,
           "metrics": {t.name: "perplexity" if t.kind == "text" else t.score_metric for t in run.general.tasks},
           "rows": {t.name: len(t.test) for t in run.general.tasks}, "before": st.general_initial, **summary(st.general)}
    if st.general_fast is not None:
        out["fast"] = summary(st.general_fast)
    return out


def buffer_counts(run) -> dict[str, int]:
    """How many entries the buffer holds per task."""
    counts: dict[str, int] = {}
    for e in run.policy.buffer.entries:
        name = run.tasks[e.task].name
        counts[name] = counts.get(name, 0) + 1
    return counts


def buffer_labels(run) -> dict[str, dict[str, int]]:
    """Per task with labels, how many kept examples carry each label, in the task's label
    order (a label the buffer does not hold counts 0): what a selection rule keeps."""
    held: dict[int, dict[str, int]] = {}
    for e in run.policy.buffer.entries:
        task = run.tasks[e.task]
        if task.kind != "classify":
            continue
        counts = held.setdefault(e.task, dict.fromkeys(task.labels, 0))
        label = run.train_sets.encoded[e.task][e.index].label
        counts[label] = counts.get(label, 0) + 1
    return {run.tasks[t].name: held[t] for t in sorted(held)}


def final_predictions(run) -> list[dict] | None:
    """``predictions.jsonl``'s rows: per task the last stage evaluated, each test row's task,
    ``index`` (its position in the task's test set as sampled and evaluated, ``run.tasks[j].test``:
    what joins a row back to the data where inputs repeat or sampling reordered them; a file's line
    or id is not carried on an Example), input, prediction (the evaluation adapter's answer as
    decoded, or the ranked label),
    gold label and whether they match under the exact-match normalisation (a generation target
    cut to ``max_length`` is scored, as in the matrix, against its kept part: ``gold``, with the
    whole target as ``gold_full``); None for text streams. A run resumed from a checkpoint written before predictions were kept evaluates
    those tasks again (every process: evaluation is sharded)."""
    if run.cfg.eval.mode == "perplexity":
        return None
    wanted = evaluated(run, run.stages[-1])
    kept = run.state.predictions or {}
    if any(run.tasks[j].name not in kept for j in wanted):
        for j in wanted:
            evaluate_task(run, j)
        kept = run.state.predictions = {run.tasks[j].name: run.predictions[j] for j in wanted}
    rows = []
    for j in wanted:
        task = run.tasks[j]
        for index, (ex, enc, pred) in enumerate(zip(task.test, run.test_sets.encoded[j], kept[task.name])):
            row = {"task": task.name, "index": index, "input": ex.sentence, "prediction": pred, "gold": enc.label}
            if enc.label != ex.label:  # a target cut to max_length: scored against what was kept
                row["gold_full"] = ex.label
            if task.kind == "generate":  # the row's score in the task's metric (ROUGE-L, exact match)
                row.update(metric=task.score_metric, score=task_score(task.score_metric, [pred], [enc.label]))
            else:
                row["correct"] = is_label(pred, ex.label, task.labels)
            rows.append(row)
    return rows


def finish(run) -> dict:
    """Write the final outputs and return the results: a transaction, every other final output
    first and ``results.json`` (the run's "finished") last, so an interruption anywhere before
    it leaves a resumable run whose rerun writes them all again. Only the main process writes
    them (:func:`surecl.processes.agreed`): with several processes each returns the results once
    they are written, or stops with the main process's error."""
    res = results(run)
    predictions = final_predictions(run)  # (every process: a resumed run may evaluate again, sharded)
    # the main process writes; every process gets its outcome, or its error line, at the same
    # point (a process that returned results of a run whose files failed would go on as if it had finished)
    agreed(run, lambda: _write_final(run, res, predictions))
    run.plugins.after_run(run, res)
    return res


def _write_final(run, res: dict, predictions: list[dict] | None) -> None:
    """The final outputs, on the main process: each claimed in the manifest, results.json last."""
    from surecl.report import write_run_report

    final = ["buffer.json", *(["predictions.jsonl"] if predictions is not None else []), *run.plugins.outputs(run),
             "report.md", "heatmap.png", "results.json"]
    for rel in final:
        run.outputs.claim(rel)
    (run.out_dir / "results.json").unlink(missing_ok=True)  # a rerun completing a finish: unfinished until it is done
    run.outputs.set_final(None)
    checkpoint.write_json(run.out_dir / "buffer.json", run.policy.buffer.state_dict())
    if predictions is not None:
        checkpoint.write_text(run.out_dir / "predictions.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in predictions))
    with checkpoint.recording_folder_writes() as written:
        run.plugins.export(run, res)  # the learner's adapters, a full fine-tuned model, prompts, ...
    run.outputs.set_contents(written)  # what --fresh removes of them (a user's files there stay)
    write_run_report(run.out_dir, res)
    fault_point("finish:results")
    run.outputs.set_final([rel for rel in final if (run.out_dir / rel).exists()])
    checkpoint.write_json(run.out_dir / "results.json", res)


def fingerprints(run) -> dict[str, str]:
    """Each task's :meth:`~surecl.data.task.Task.fingerprint` (computed once)."""
    if getattr(run, "data_fingerprints", None) is None:
        run.data_fingerprints = {t.name: t.fingerprint() for t in run.tasks}
    return run.data_fingerprints


def encoding_digests(run) -> dict[str, str]:
    """Each task's SHA-256 of its rows as encoded (prompt, answer and mask ids, train then test;
    computed once): a checkpoint records them, so a resume whose prompts would be built
    otherwise (another tokenizer's start tokens, a task's group under ``data.task_prefix``,
    surecl's own prompt format changed) stops instead of training on the new ones."""
    if getattr(run, "encoded_digests", None) is None:
        import hashlib
        import json

        out = {}
        for task, train, test in zip(run.tasks, run.train_sets.encoded, run.test_sets.encoded):
            h = hashlib.sha256()
            for rows in (train, test):
                for e in rows:
                    h.update(json.dumps([list(e.prompt), list(e.answer), None if e.mask is None else list(e.mask)]).encode())
                h.update(b"|")
            out[task.name] = h.hexdigest()
        run.encoded_digests = out
    return run.encoded_digests


def base_fingerprint(model) -> str:
    """A digest of the base model as loaded: each parameter's name, shape and 64 values spread
    over it, taken in bf16 (so an fp32 and a bf16 load of the same weights agree: a resume on a
    machine that picks the other dtype is the same base). Read before any adapter is added.
    Seconds for billions of weights; a changed model file (same shapes, new values) differs."""
    import hashlib

    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            step = max(1, flat.numel() // 64)
            sample = flat[::step][:64].to(device="cpu", dtype=torch.bfloat16).view(torch.int16)
            h.update(f"{name}:{tuple(p.shape)}:".encode())
            h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


def probe_fingerprints(run) -> dict[str, str]:
    """Each general-ability probe part's :meth:`~surecl.data.task.Task.fingerprint` ({} without a
    probe; computed once, as :func:`fingerprints`: every checkpoint records them)."""
    if getattr(run, "probe_digests", None) is None:
        general = getattr(run, "general", None)
        run.probe_digests = {t.name: t.fingerprint() for t in general.tasks} if general is not None else {}
    return run.probe_digests


def provenance(run) -> dict:
    """Where the run's model and tasks came from (results.json ``provenance``): the model's
    class and ``name_or_path`` (the config's ``model.name`` unless the caller passed a
    model), each task's data fingerprint (``fingerprints``: of its sampled rows, as checkpoints
    record them; ``given``: of each task passed from Python as passed, its
    :meth:`~surecl.data.task.Task.fingerprint`), and with a model or tasks passed from Python a
    ``note`` that config.yaml alone does not rerun the run."""
    supplied = [what for what, yes in (("model", run.supplied_model), ("tasks", run.supplied_tasks)) if yes]
    out = {
        "model": {"source": "python" if run.supplied_model else "config", "name_or_path": run.model_name_or_path,
                  "class": run.model_class},
        "data": {"source": "python" if run.supplied_tasks else "config", "fingerprints": fingerprints(run)},
    }
    if run.supplied_tasks:
        out["data"]["given"] = run.given_fingerprints
    if supplied:
        out["note"] = f"{' and '.join(supplied)} {SUPPLIED_NOTE}"
    return out


def config_header(run) -> str | None:
    """The comment config.yaml starts with when the model or tasks came from Python (None: the
    config alone reruns the run)."""
    prov = provenance(run)
    if "note" not in prov:
        return None
    lines = ["# surecl run config, resolved (presets and overrides applied)", f"# NOTE: {prov['note']}:"]
    if run.supplied_model:
        lines.append(f"#   model: a {run.model_class} with name_or_path {run.model_name_or_path or '(none: built in code)'!s}; "
                     "model.name below is not the model that ran")
    if run.supplied_tasks:
        lines.append("#   tasks (data.* below is not the data that ran), SHA-256 fingerprints (Task.fingerprint()) as passed:")
        lines += [f"#     {name}: {digest}" for name, digest in prov["data"]["given"].items()]
    return "\n".join(lines) + "\n"
