"""Review 27: a generation task's evaluation no longer reads its own test references.

Before ``eval.answer_budget`` the tokens generated per answer were the task's longest test
reference + 1 (a row's answer depended on which other rows the test sample drew) and each test
prompt was cut to leave room for its own reference (the longer the gold answer, the less input
the model read). ``train`` (the default) takes the budget from the training targets and cuts
every test prompt of a task alike; ``references`` keeps the earlier behaviour, and a saved
config without the key reads as it."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import yaml
from test_generation import chatml_tokenizer

from surecl.config import build_config, same_config
from surecl.data.encode import Encoded, TaskEncoder
from surecl.data.task import Example, Task
from surecl.errors import SureclError

SHORT = "cool"
LONG = " ".join(["warm", "cool"] * 20)
INPUT = " ".join(["is", "of", "with", "blue"] * 8)


def stream(test: list[Example]) -> list[Task]:
    """One generation task whose training targets are one word; ``test`` its test rows."""
    train = [Example("is of with blue", "cool"), Example("of this or for yellow", "warm")] * 4
    return [Task("colors", "Which class fits the cue word in the text?\n", [], train, test, kind="generate")]


def built(tmp_path, tiny_cache, tiny_loaded, test: list[Example], *overrides: str):
    from surecl.trainer import ContinualRun

    cfg = build_config("tiny,seq_lora", ["data.benchmark=none", "model.max_length=24", "eval.batch_size=8", *overrides])
    return ContinualRun(cfg, tmp_path, progress=False, cache_dir=tiny_cache, model=copy.deepcopy(tiny_loaded.model),
                        tokenizer=tiny_loaded.tokenizer, tasks=stream(test))


def answer_of_row_a(tmp_path, tiny_cache, tiny_loaded, test, *overrides):
    """Row A's greedy answer, the test rows as evaluation reads them, and the run."""
    run = built(tmp_path, tiny_cache, tiny_loaded, test, *overrides)
    run.evaluate_task(0)
    return run.predictions[0][0], run.test_sets.encoded[0], run


def budget_of(run) -> int:
    from surecl.run_eval import new_token_budget

    return new_token_budget(run.cfg, run.tasks[0], run.test_sets.encoded[0], None, run.train_sets.encoded[0])


def test_a_rows_answer_does_not_depend_on_the_other_test_rows(tmp_path, tiny_cache, tiny_loaded):
    """Row A alone, or beside a row whose reference is 40 words long: the same budget (the
    longest training target + 1), the same prompt and so the same greedy answer (before, the
    budget was the longest test reference + 1: 2 tokens alone, 41 beside B)."""
    a = Example("is of with blue", SHORT)
    alone, items_alone, run_alone = answer_of_row_a(tmp_path / "alone", tiny_cache, tiny_loaded, [a])
    beside, items_beside, run_beside = answer_of_row_a(tmp_path / "beside", tiny_cache, tiny_loaded, [a, Example("is of with blue", LONG)])
    assert items_alone[0].prompt == items_beside[0].prompt
    assert alone == beside
    assert budget_of(run_alone) == budget_of(run_beside) == 3  # " warm" / " cool" and EOS, + 1


def test_a_test_prompts_cut_does_not_depend_on_its_own_reference(tmp_path, tiny_cache, tiny_loaded):
    """Two test rows with one long input: a short and a long reference. Each prompt is cut to
    leave room for the task's budget, so both read the same input; the long reference is scored
    whole (before, the long one's prompt was cut to 12 tokens, the short one's to 21, and its
    reference was cut to the tokens that fit)."""
    run = built(tmp_path, tiny_cache, tiny_loaded, [Example(INPUT, SHORT), Example(INPUT, LONG)])
    short, long = run.test_sets.encoded[0]
    assert short.prompt == long.prompt and len(short.prompt) == 24 - 3  # max_length - the budget
    assert short.label == SHORT and long.label == LONG


def test_references_keeps_the_earlier_budget_and_cut(tmp_path, tiny_cache, tiny_loaded):
    """``eval.answer_budget=references``: exactly the earlier encoding (each test row as
    TaskEncoder encodes it without a reserve: its prompt cut for its own target, a cut target
    scored as kept) and budget (the longest test target + 1), so row A's answer depends on B again."""
    a, b = Example("is of with blue", SHORT), Example("is of with blue", LONG)
    old = "eval.answer_budget=references"
    alone, _, run_alone = answer_of_row_a(tmp_path / "alone", tiny_cache, tiny_loaded, [a], old)
    beside, items, run_beside = answer_of_row_a(tmp_path / "beside", tiny_cache, tiny_loaded, [a, b], old)
    assert (budget_of(run_alone), budget_of(run_beside)) == (3, len(items[1].answer) + 1) and len(items[1].answer) > 10
    assert alone != beside
    run = built(tmp_path / "cut", tiny_cache, tiny_loaded, [Example(INPUT, SHORT), Example(INPUT, LONG)], old)
    task = run.tasks[0]
    assert run.test_sets.encoded[0] == TaskEncoder(tiny_loaded.tokenizer, 24).encode(task, task.test, split="test")
    short, long = run.test_sets.encoded[0]
    assert len(long.prompt) < len(short.prompt) and long.label != LONG and LONG.startswith(long.label)


def test_a_task_without_training_rows_keeps_its_own_budget_and_cuts_its_prompts_alike(tiny_loaded):
    """The general-ability probe's tasks have no training rows: the budget stays its own longest
    test target + 1 (as under ``references``), and every prompt leaves room for that budget."""
    from surecl.run_eval import encode_test, new_token_budget

    task = Task("probe", "", [], [], [Example(INPUT, SHORT), Example(INPUT, " ".join(["warm"] * 6))], kind="generate")
    old = build_config("tiny,seq_lora", ["model.max_length=24", "eval.answer_budget=references"])
    new = build_config("tiny,seq_lora", ["model.max_length=24"])
    before = encode_test(old, TaskEncoder(tiny_loaded.tokenizer, 24), task, [])
    after = encode_test(new, TaskEncoder(tiny_loaded.tokenizer, 24), task, [])
    assert new_token_budget(new, task, after, None, []) == new_token_budget(old, task, before, None, []) == 8
    assert after[0].prompt == after[1].prompt and len(after[0].prompt) == 24 - 8
    assert len(before[0].prompt) != len(before[1].prompt)


@pytest.mark.parametrize("conversation", [False, True])
def test_chat_test_prompts_leave_the_budgets_room_alike(conversation):
    """Through a chat template too: a prompt / response row's input is cut at its end, a
    conversation in its middle, to the same length whatever the row's own reference."""
    from surecl.run_eval import encode_test, new_token_budget

    tok = chatml_tokenizer()
    long_input = " ".join(["hi"] * 30)

    def row(target: str) -> Example:
        if not conversation:
            return Example(long_input, target)
        turns = (("system", "be short"), ("user", long_input), ("assistant", "hello"), ("user", "bye ?"), ("assistant", target))
        return Example("bye ?", target, turns)

    task = Task("chat", "", [], [row("hello")], [row("see"), row(" ".join(["see", "you"] * 6))], kind="generate")
    cfg = build_config("tiny,seq_lora", ["model.max_length=24"])
    enc = TaskEncoder(tok, 24)
    train = enc.encode(task, task.train)
    short, long = encode_test(cfg, enc, task, train)
    budget = new_token_budget(cfg, task, [short, long], None, train)
    assert budget == len(train[0].answer) + 1 if not conversation else budget == 3  # "hello <|im_end|>" + 1
    assert short.prompt == long.prompt and 24 - budget - 2 <= len(short.prompt) <= 24 - budget  # (a cut input re-tokenised: a token's slack)
    assert long.label == " ".join(["see", "you"] * 6) and enc.cut.get(("chat", "test")) is None
    old = build_config("tiny,seq_lora", ["model.max_length=24", "eval.answer_budget=references"])
    short, long = encode_test(old, TaskEncoder(tok, 24), task, train)
    assert len(short.prompt) > len(long.prompt)


def test_the_longest_training_target_of_a_conversation_is_its_longest_assistant_turn():
    """A training conversation's "answer" runs from its first assistant turn to the end, user
    turns between read only: the budget counts one turn, what one generated answer is."""
    row = Encoded([1], [5, 6, 7, 0, 0, 0, 0, 8, 9], "x", mask=[1, 1, 1, 0, 0, 0, 0, 1, 1])
    assert row.longest_turn == 3 and Encoded([1], [5, 6], "x").longest_turn == 2


def test_max_new_tokens_still_sets_the_budget_under_both():
    from surecl.run_eval import new_token_budget

    task = Task("g", "", [], [Example("a", "b")], [Example("a", "b")], kind="generate")
    rows = [Encoded([1, 2], [3, 4, 5], "b")]
    for mode in ("train", "references"):
        cfg = build_config("tiny,seq_lora", [f"eval.answer_budget={mode}", "eval.max_new_tokens=7"])
        assert new_token_budget(cfg, task, rows, None, [Encoded([1], [3], "b")]) == 7


def test_the_option_is_checked():
    with pytest.raises(SureclError, match=r"eval.answer_budget: 'gold' is not one of train, references"):
        build_config("tiny,seq_lora", ["eval.answer_budget=gold"])


def without_key(tree: dict) -> dict:
    return {**tree, "eval": {k: v for k, v in tree["eval"].items() if k != "answer_budget"}}


def test_a_saved_config_without_the_key_ran_references():
    """A run saved before the key (results.json, config.yaml, a checkpoint: same_config) ran
    ``references``: it is that run, not a ``train`` one; a run that evaluates no generation task
    reads neither, so an old classification run stays the run its config names."""
    gen = ["data.kind=generate"]
    old = without_key(build_config("tiny,seq_lora", gen).to_dict())
    assert same_config(old, build_config("tiny,seq_lora", gen + ["eval.answer_budget=references"]))
    assert not same_config(old, build_config("tiny,seq_lora", gen))
    classify = without_key(build_config("tiny,seq_lora").to_dict())
    assert same_config(classify, build_config("tiny,seq_lora")) and same_config(classify, build_config("tiny,seq_lora", ["eval.answer_budget=references"]))
    probe = ["eval.general=default"]  # its instruction part is generated
    assert not same_config(without_key(build_config("tiny,seq_lora", probe).to_dict()), build_config("tiny,seq_lora", probe))
    # a saved config that names the key is read as it says
    assert same_config(build_config("tiny,seq_lora", gen).to_dict(), build_config("tiny,seq_lora", gen))


def test_an_old_runs_folder_is_skipped_under_references_and_refused_under_train(tmp_path, tiny_cache, monkeypatch, capsys):
    """End to end: a finished generation run whose results.json and config.yaml lack the key is
    the finished run of ``eval.answer_budget=references`` (skipped), a different run under the
    new default (refused); its own config.yaml runs it again as it ran."""
    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    out = tmp_path / "run"
    args = ["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(out), "data.kind=generate", "data.n_train=8", "data.n_test=4",
            "data.tasks=[colors]", "train.epochs=1", "eval.before=false"]
    assert main([*args, "eval.answer_budget=references"]) == 0
    results = json.loads((out / "results.json").read_text())
    results["config"] = without_key(results["config"])
    (out / "results.json").write_text(json.dumps(results))
    text = (out / "config.yaml").read_text()
    assert "answer_budget: references" in text
    (out / "config.yaml").write_text(text.replace("  answer_budget: references\n", ""))
    assert build_config(str(out / "config.yaml")).eval.answer_budget == "references"
    capsys.readouterr()
    assert main([*args, "eval.answer_budget=references"]) == 0
    assert main(args) == 2
    assert "already holds a finished run with a different config" in capsys.readouterr().err
    assert yaml.safe_load((out / "config.yaml").read_text())["eval"].get("answer_budget") is None  # nothing was rewritten


def test_a_generation_rows_reference_is_not_checked_against_the_models_positions():
    """Evaluation reads a generation test row's prompt and generates its budget; the reference is
    never read, so a long one beside a prompt that fits is no reason to refuse the run."""
    from surecl.run_setup import check_context
    from surecl.run_state import InputSets

    gen = SimpleNamespace(name="qa", kind="generate")
    train = [Encoded(list(range(4)), [5, 1], "a")]
    test = [Encoded(list(range(56)), list(range(20)), "a long reference")]  # 56 + 3 fit 64; 56 + 21 would not
    run = SimpleNamespace(is_seq2seq=False, tasks=[gen], cfg=build_config("tiny", ["model.max_length=60"]),
                          train_sets=InputSets([train], lambda t: ()), test_sets=InputSets([test], lambda t: ()),
                          label_answers=[{}], general=None, general_sets=[])
    check_context(run, SimpleNamespace(n_positions=64))
    long_train = SimpleNamespace(**{**vars(run), "train_sets": InputSets([[Encoded([1], list(range(20)), "x")]], lambda t: ())})
    with pytest.raises(SureclError, match=r"task qa: rows of up to 77 tokens .* the 21 tokens evaluation generates"):
        check_context(long_train, SimpleNamespace(n_positions=64))


def test_the_max_length_help_says_where_a_conversation_is_cut():
    """A conversation too long keeps its opening and last turns and loses its middle; it is cut
    from its start only where the opening would take over half the room."""
    import ast
    import inspect

    from surecl.sections import ModelConfig

    body = ast.parse(inspect.getsource(ModelConfig)).body[0].body
    doc = next(" ".join(d.value.value.split()) for f, d in zip(body, body[1:])
               if isinstance(f, ast.AnnAssign) and f.target.id == "max_length")
    assert "a conversation from its start" not in doc
    assert "a conversation in its middle" in doc and "over half the room" in doc


@pytest.mark.parametrize("mode", ["train", "references"])
def test_predictions_score_a_long_reference_as_the_matrix_does(mode, tmp_path, tiny_cache, monkeypatch, capsys):
    """predictions.jsonl: under ``train`` a reference longer than max_length allows is the gold
    whole (no ``gold_full``: nothing was cut), and the run says that a reference is longer than
    the answer budget (no answer can match it whole); under ``references`` the kept part is the
    gold and the whole one ``gold_full``, as before. Either way the rows' scores average to the
    matrix cell."""
    from statistics import fmean

    from surecl.cli import main

    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    long = " ".join(["blue", "cat"] * 30)
    rows = [{"prompt": "cat", "response": "blue"}, {"prompt": "blue", "response": "cat"},
            {"prompt": "cat", "response": long, "split": "test"}, {"prompt": "blue", "response": "cat", "split": "test"}]
    (tmp_path / "g.jsonl").write_text(json.dumps({"task": "g", "kind": "generate", "metric": "rouge_l"}) + "\n"
                                      + "".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    assert main(["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(out), "data.benchmark=none", f"eval.answer_budget={mode}",
                 f"data.jsonl=[{tmp_path / 'g.jsonl'}]", "model.max_length=24", "train.epochs=1"]) == 0
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    first = preds[0]
    said = [line for line in capsys.readouterr().err.splitlines() if "longer than its answer budget" in line]
    if mode == "train":
        assert first["gold"] == long and "gold_full" not in first
        assert len(said) == 1 and "task g: 1 of 2 test references" in said[0] and "eval.max_new_tokens" in said[0], said
    else:
        assert not said, said
        assert first["gold_full"] == long and long.startswith(first["gold"]) and first["gold"] != long
    matrix = json.loads((out / "results.json").read_text())["accuracy_matrix"]
    assert fmean(p["score"] for p in preds) == pytest.approx(matrix[-1][0], abs=1e-3)
