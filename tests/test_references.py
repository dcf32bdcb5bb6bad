"""eval.references: a generation task's test rows that share an input (a prompt with several
references) scored each alone (``rows``, every run before the key) or as one instance whose score
is its best reference (``max``, Super-NaturalInstructions' compute_metrics), and which configs
set which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surecl.cli import main
from surecl.config import build_config, same_config
from surecl.data.task import Example
from surecl.evaluate import instances, task_score

ROOT = Path(__file__).resolve().parents[1]

# three prompts, five test rows: cat has two references, dog one, fish two
TEST_ROWS = [("cat", "blue sky"), ("cat", "green grass"), ("dog", "red car"), ("fish", "one two"), ("fish", "one two three four")]
ANSWER = {"cat": "blue sky", "dog": "red", "fish": "one two three"}
"""What the stand-in model answers each prompt: one reference of cat's exactly, a part of dog's,
and of fish's a part of both."""
# ROUGE-L F of each row's answer against its own reference, by hand (LCS over words):
# cat 1 and 0; dog "red" / "red car": P 1, R 1/2, F 2/3; fish "one two three" / "one two": P 2/3,
# R 1, F 4/5; / "one two three four": P 1, R 3/4, F 6/7
ROWS_SCORE = 100 * (1 + 0 + 2 / 3 + 4 / 5 + 6 / 7) / 5  # each row alone: 66.48
MAX_SCORE = 100 * (1 + 2 / 3 + 6 / 7) / 3  # each prompt's best reference: 84.13


def test_hand_computed_rows_and_max_differ():
    """The metric alone: rows averages a prompt's references, max takes its best, for ROUGE-L
    and exact match (cat answered with its first reference: 50 over its rows, 100 as one instance)."""
    examples = [Example(p, g) for p, g in TEST_ROWS]
    keys = instances(examples)
    assert keys == [0, 0, 2, 3, 3]
    preds, gold = [ANSWER[p] for p, _ in TEST_ROWS], [g for _, g in TEST_ROWS]
    assert task_score("rouge_l", preds, gold) == pytest.approx(ROWS_SCORE)
    assert task_score("rouge_l", preds, gold, instances=keys) == pytest.approx(MAX_SCORE)
    assert task_score("exact_match", preds[:2], gold[:2]) == 50.0
    assert task_score("exact_match", preds[:2], gold[:2], instances=keys[:2]) == 100.0


def test_an_instance_is_its_input_and_conversation():
    """Rows are one instance only where the input is the same: a conversation's turns before
    its answer count, its answer does not."""
    chat = lambda user, answer: Example(user, answer, (("user", user), ("assistant", answer)))  # noqa: E731
    rows = [chat("hi", "hello"), chat("hi", "hey"), Example("hi", "yo"), chat("bye", "ciao")]
    assert instances(rows) == [0, 0, 2, 3]


def _run(tmp_path: Path, tiny_cache: Path, monkeypatch, references: str) -> tuple[dict, list[dict], list[int]]:
    """A tiny run on one generation task holding TEST_ROWS, its answers given by a stand-in for
    greedy generation that answers each prompt ANSWER's text: results.json, predictions.jsonl's
    rows and how many rows each generation call was asked."""
    import surecl.run_eval

    by_reference = {g: ANSWER[p] for p, g in TEST_ROWS}
    calls: list[int] = []

    def answers(model, tokenizer, part, **kw):
        calls.append(len(part))
        return [by_reference[e.label] for e in part]

    monkeypatch.setattr(surecl.run_eval, "generate_answers", answers)
    rows = [{"prompt": p, "response": g} for p, g in [("cat", "blue sky"), ("dog", "red car"), ("fish", "one two")]]
    rows += [{"prompt": p, "response": g, "split": "test"} for p, g in TEST_ROWS]
    data = tmp_path / "g.jsonl"
    data.write_text(json.dumps({"task": "g", "kind": "generate", "metric": "rouge_l"}) + "\n" + "".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / references
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    assert main(["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(out), "data.benchmark=none", f"data.jsonl=[{data}]",
                 "train.epochs=1", f"eval.references={references}"]) == 0
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return json.loads((out / "results.json").read_text()), preds, calls


def test_a_run_scores_each_prompt_by_its_best_reference_under_max(tmp_path, tiny_cache, monkeypatch):
    """eval.references=max in a run: the task's cell is the hand-computed mean over prompts of
    each one's best reference, each prompt answered once; predictions.jsonl keeps one line per
    test row, scored against its own reference, as under rows."""
    results, preds, calls = _run(tmp_path, tiny_cache, monkeypatch, "max")
    assert results["accuracy_matrix"][0][0] == pytest.approx(MAX_SCORE, abs=1e-3)
    assert calls and set(calls) == {3}  # three prompts, one answer each
    assert len(preds) == len(TEST_ROWS) and set(preds[0]) == {"task", "index", "input", "prediction", "gold", "metric", "score"}
    by_input: dict[str, set[str]] = {}
    for p in preds:
        by_input.setdefault(p["input"], set()).add(p["prediction"])
        assert p["score"] == pytest.approx(task_score("rouge_l", [p["prediction"]], [p["gold"]]))
    assert by_input == {p: {a} for p, a in ANSWER.items()}
    rows_results, rows_preds, rows_calls = _run(tmp_path, tiny_cache, monkeypatch, "rows")
    assert rows_results["accuracy_matrix"][0][0] == pytest.approx(ROWS_SCORE, abs=1e-3)  # the default: every row alone, as before
    assert set(rows_calls) == {5}
    assert sorted((p["input"], p["gold"], p["prediction"], p["score"]) for p in rows_preds) == sorted(
        (p["input"], p["gold"], p["prediction"], p["score"]) for p in preds)


def test_the_instruct_preset_scores_max_and_the_default_rows():
    """The instruct setting takes each prompt's best reference; the default and every config
    saved before the key (which it takes as rows) score rows; the instruct study pins rows, the
    scoring its finished runs were made with, so its sweep finds them the same runs."""
    from surecl.sweep import expand, load_plan

    assert build_config("instruct").eval.references == "max"
    assert build_config("instruct,seq_lora").eval.references == "max"
    assert build_config("tiny").eval.references == "rows" and build_config("seq_lora").eval.references == "rows"
    cfg = build_config("tiny")
    saved = cfg.to_dict()
    saved["eval"] = {k: v for k, v in saved["eval"].items() if k != "references"}  # a config written before the key
    assert same_config(saved, cfg)
    assert not same_config(saved, build_config("tiny", ["eval.references=max"]))
    plan = load_plan(str(ROOT / "studies" / "instruct.yaml"))
    for r in expand(plan):
        assert build_config(f"{plan.config},{r.method}", r.overrides).eval.references == "rows"


@pytest.mark.parametrize("args", [["run", "--dry-run", "--config", "tiny", "eval.references=mean"],
                                  ["run", "--dry-run", "--config", "instruct", "eval.references=all"]])
def test_an_unknown_value_is_one_line(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "eval.references" in err and "is not one of rows, max" in err
