"""Review 24 of data reading: ``data.tasks`` orders a benchmark's tasks and the user's own
alike; a CL_Benchmark folder's instructions read as every reader reads one (a newline after a
final word, NFD group folders); a misplaced ``data.benchmark`` and an empty JSONL file are
each one line saying what they are."""

from __future__ import annotations

import dataclasses
import json
import re
import unicodedata
from pathlib import Path

import pytest

from surecl.config import build_config
from surecl.data.cl_benchmark import load_benchmark, load_task
from surecl.data.encode import build_prompt
from surecl.data.jsonl import load_jsonl_task
from surecl.data.loading import check_order, load_stream, missing_tasks_warning, unnamed_tasks_warning
from surecl.errors import SureclError


def bench_folder(root: Path, instructions: dict, tasks: dict[str, list[str]]) -> Path:
    """A CL_Benchmark folder: ``instructions`` as instruction_config.json, and each
    ``"<group>/<task>"`` of ``tasks`` with its labels and four rows per split."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "instruction_config.json").write_text(json.dumps(instructions), encoding="utf-8")
    for where, labels in tasks.items():
        folder = root / where
        folder.mkdir(parents=True)
        (folder / "labels.json").write_text(json.dumps(labels))
        for split in ("train", "test"):
            rows = [{"sentence": f"{folder.name} {split} {i}", "label": labels[i % len(labels)]} for i in range(4)]
            (folder / f"{split}.json").write_text(json.dumps(rows))
    return root


def jsonl_file(path: Path, name: str) -> Path:
    rows = [{"task": name, "labels": ["cool", "warm"]}]  # words of the tiny model's vocabulary
    rows += [{"sentence": f"{name} {i}", "label": ["cool", "warm"][i % 2], "split": "test" if i >= 4 else "train"} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------ 1. data.tasks naming a data.jsonl task beside a benchmark


def test_data_tasks_orders_a_benchmarks_tasks_and_the_users_own_alike(tmp_path, tiny_cache):
    from surecl.plan import describe
    from surecl.trainer import ContinualRun

    bench = bench_folder(tmp_path / "bench", {"TC": ["Topic? "], "SC": ["Mood? "]}, {"TC/topics": ["pet", "wild"], "SC/moods": ["even", "odd"]})
    mine = jsonl_file(tmp_path / "ok.jsonl", "ok")
    base = ["data.benchmark=" + str(bench), f"data.jsonl=[{mine}]", "data.n_train=4", "data.n_test=2", "train.epochs=1"]

    def stream(*extra):
        return load_stream(build_config("tiny,seq_lora", [*base, *extra]))

    # the order asked for, no task called missing: the file's task is no benchmark task
    asked = stream("data.tasks=[ok,moods,topics]")
    assert [t.name for t in asked] == ["ok", "moods", "topics"]
    assert missing_tasks_warning(asked, "default") is None
    assert [t.name for t in stream("data.tasks=[moods,ok]")] == ["moods", "ok"]  # a task list chooses, as with benchmark=none
    # and a file of the user's that it leaves out does not run: said, not silent
    chosen = stream("data.tasks=[moods,topics]")
    assert [t.name for t in chosen] == ["moods", "topics"]
    assert "data.tasks leaves out the data.jsonl / data.hf task(s) ok: they do not run" in unnamed_tasks_warning(chosen)
    assert unnamed_tasks_warning(asked) is None and unnamed_tasks_warning(stream()) is None
    assert [t.name for t in stream("data.tasks=[ok]")] == ["ok"]  # the folder's tasks left out, none of them missing
    assert [t.name for t in stream()] == ["moods", "topics", "ok"]  # no task list: the folder's order, then the file's
    # a name in neither is refused as before, or under data.allow_missing left out and named
    with pytest.raises(SureclError, match=r"lacks task\(s\) weather named by the order \(set data.allow_missing=true"):
        stream("data.tasks=[ok,weather,topics]")
    kept = stream("data.tasks=[ok,weather,topics]", "data.allow_missing=true")
    assert [t.name for t in kept] == ["ok", "topics"]
    assert missing_tasks_warning(kept, "default").startswith("order default: the benchmark folder lacks weather; the stream runs 2 of its 3")
    # a name of both a folder's task and a file's task: which would run is not guessed
    clash = jsonl_file(tmp_path / "topics.jsonl", "topics")
    with pytest.raises(SureclError, match=r"data.tasks: topics names a task of the benchmark and a data.jsonl / data.hf task"):
        load_stream(build_config("tiny,seq_lora", [*base[:1], f"data.jsonl=[{clash}]", "data.tasks=[topics,moods]"]))

    # the dry run shows the order the run trains
    cfg = build_config("tiny,seq_lora", [*base, "data.tasks=[ok,moods,topics]"])
    plan = describe(cfg, cache_dir=tiny_cache)
    assert re.findall(r"^\| \d+ \| (\S+) \|", plan, re.M) == ["ok", "moods", "topics"], plan
    assert "lacks" not in plan
    left = describe(build_config("tiny,seq_lora", [*base, "data.tasks=[moods]"]), cache_dir=tiny_cache)
    assert "warning: data.tasks leaves out the data.jsonl / data.hf task(s) ok" in left
    run = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert [t.name for t in run.tasks] == ["ok", "moods", "topics"]


def test_a_sweeps_order_check_takes_a_data_jsonl_task_as_the_run_does(tmp_path):
    """``check_order(folder=True)``, which a sweep runs on each order before it writes its plan."""
    bench = bench_folder(tmp_path / "bench", {"TC": ["Topic? "], "SC": ["Mood? "]}, {"TC/topics": ["pet", "wild"], "SC/moods": ["even", "odd"]})
    mine = jsonl_file(tmp_path / "ok.jsonl", "ok")
    data = build_config("tiny,seq_lora", [f"data.benchmark={bench}", f"data.jsonl=[{mine}]", "data.tasks=[ok,moods]"]).data
    check_order(data, folder=True)
    check_order(dataclasses.replace(data, tasks=["ok"]), folder=True)
    with pytest.raises(SureclError, match=r"lacks task\(s\) weather named by the order"):
        check_order(dataclasses.replace(data, tasks=["ok", "moods", "weather"]), folder=True)
    with pytest.raises(SureclError, match=r"lacks task\(s\) ok named by the order"):  # without the file, ok is no task
        check_order(dataclasses.replace(data, jsonl=[]), folder=True)


def test_data_tasks_names_the_users_own_tasks_beside_the_tiny_benchmark(tmp_path):
    mine = jsonl_file(tmp_path / "ok.jsonl", "ok")
    base = [f"data.jsonl=[{mine}]"]
    assert [t.name for t in load_stream(build_config("tiny", [*base, "data.tasks=[ok,colors]"]))] == ["ok", "colors"]
    with pytest.raises(SureclError, match=r"data.tasks: the tiny benchmark or data.jsonl / data.hf has no task gamma"):
        load_stream(build_config("tiny", [*base, "data.tasks=[ok,gamma]"]))
    clash = jsonl_file(tmp_path / "colors.jsonl", "colors")
    with pytest.raises(SureclError, match=r"data.tasks: colors names a task of the benchmark"):
        load_stream(build_config("tiny", [f"data.jsonl=[{clash}]", "data.tasks=[colors]"]))


def test_two_user_tasks_of_one_name_chosen_by_data_tasks_are_refused(tmp_path):
    one, two = jsonl_file(tmp_path / "one.jsonl", "same"), jsonl_file(tmp_path / "two.jsonl", "same")
    with pytest.raises(SureclError, match=r"^task named twice in the stream: same$"):
        load_stream(build_config("tiny", ["data.benchmark=none", f"data.jsonl=[{one},{two}]", "data.tasks=[same]"]))


# ------------------------------------------------------------------ 2. a folder's instruction ending in a word


def test_a_benchmark_folders_instruction_ending_in_a_word_gets_a_newline(tmp_path):
    bench = bench_folder(tmp_path / "bench", {"SC": ["Is the review good or bad?"]}, {"SC/reviews": ["good", "bad"]})
    [task] = load_benchmark(bench)
    assert task.instruction == "Is the review good or bad?\n"
    assert build_prompt(task, "fine film") == "Is the review good or bad?\nOption: good, bad \nfine film\nAnswer:"


OLORA = {  # O-LoRA's CL_Benchmark/instruction_config.json, as it ships
    "NLI": 'What is the logical relationship between the "sentence 1" and the "sentence 2"? Choose one from the option.\n',
    "QQP": 'Whether the "first sentence" and the "second sentence" have the same meaning? Choose one from the option.\n',
    "SC": "What is the sentiment of the following paragraph? Choose one from the option.\n",
    "TC": "What is the topic of the following paragraph? Choose one from the option.\n",
    "BoolQA": "According to the following passage, is the question true or false? Choose one from the option.\n",
    "MultiRC": "According to the following passage and question, is the candidate answer true or false? Choose one from the option.\n",
    "WiC": "Given a word and two sentences, whether the word is used with the same sense in both sentence? Choose one from the option.\n",
}
EMBEDDED = {  # the embedded benchmark's, as data/embedded.py writes them
    "topic": "What is the topic of the following newsgroup post? Choose one from the option. ",
    "sentiment": "What is the sentiment of the following tweet? Choose one from the option. ",
    "finance": "What is the subject of the following financial news story? Choose one from the option. ",
    "review": "What is the critic's verdict in the following movie review? Choose one from the option. ",
}


def test_the_packaged_instructions_give_the_prompts_they_gave(tmp_path):
    """O-LoRA's instructions (ending in a newline) and the embedded benchmark's (in a space)
    are read byte for byte: every prompt of theirs is what it was before the newline rule."""
    from surecl.data.embedded import _TASKS

    assert {spec.group: spec.instruction for spec in _TASKS} == EMBEDDED
    olora = bench_folder(tmp_path / "olora", {g: [{"instruction_type": "zero-shot", "instruction": i}] for g, i in OLORA.items()},
                         {f"{g}/{g.lower()}": ["yes", "no"] for g in OLORA})
    embedded = bench_folder(tmp_path / "embedded", {g: [i] for g, i in EMBEDDED.items()}, {f"{g}/{g}-task": ["yes", "no"] for g in EMBEDDED})
    for root, given in ((olora, OLORA), (embedded, EMBEDDED)):
        tasks = load_benchmark(root)
        assert sorted(t.group for t in tasks) == sorted(given)
        for t in tasks:
            assert t.instruction == given[t.group]
            assert build_prompt(t, "s") == given[t.group] + "Option: yes, no \ns\nAnswer:"
    sc = next(t for t in load_benchmark(olora) if t.group == "SC")
    assert build_prompt(sc, "s") == "What is the sentiment of the following paragraph? Choose one from the option.\nOption: yes, no \ns\nAnswer:"
    topic = next(t for t in load_benchmark(embedded) if t.group == "topic")
    assert build_prompt(topic, "s") == ("What is the topic of the following newsgroup post? Choose one from the option. "
                                        "Option: yes, no \ns\nAnswer:")


# ------------------------------------------------------------------ 3. a group folder named NFD


@pytest.mark.parametrize("folder_form, key_form", [("NFD", "NFC"), ("NFC", "NFD"), ("NFD", "NFD")])
def test_a_group_folder_named_in_decomposed_unicode_finds_its_instruction(tmp_path, folder_form, key_form):
    group = "Gefühl"
    bench = bench_folder(tmp_path / "bench", {unicodedata.normalize(key_form, group): ["Sentiment? "]},
                         {f"{unicodedata.normalize(folder_form, group)}/stimmung": ["gut", "schlecht"]})
    assert [p.name for p in bench.iterdir() if p.is_dir()] == [unicodedata.normalize(folder_form, group)]  # kept as written
    [task] = load_benchmark(bench)
    assert task.instruction == "Sentiment? " and task.group == unicodedata.normalize("NFC", group)
    folder = next(bench.glob("*/stimmung"))
    assert load_task(folder, {group: "Sentiment? "}).group == group


# ------------------------------------------------------------------ 4. a misplaced data.benchmark


def test_a_file_given_as_data_benchmark_is_said_to_be_a_file(tmp_path):
    mine = jsonl_file(tmp_path / "ok.jsonl", "ok")
    with pytest.raises(SureclError) as err:
        load_stream(build_config("tiny", [f"data.benchmark={mine}"]))
    assert str(err.value) == f"data.benchmark: {mine} is a file, not a CL_Benchmark folder (a JSONL task goes in data.jsonl)"


def test_a_folder_holding_no_benchmark_task_says_where_to_point(tmp_path):
    bench_folder(tmp_path / "benchmarks" / "CL_Benchmark", {"TC": ["Topic? "]}, {"TC/topics": ["x", "y"]})
    for root in (tmp_path / "benchmarks", tmp_path / "benchmarks" / "CL_Benchmark" / "TC"):
        with pytest.raises(SureclError) as err:
            load_stream(build_config("tiny", [f"data.benchmark={root}"]))
        assert str(err.value) == (f"{root}: holds no <group>/<task>/labels.json (point data.benchmark at the folder holding "
                                  "instruction_config.json)")
    # a folder with tasks, none of them those asked for, lists its own as before
    with pytest.raises(SureclError, match=r"holds none of the tasks colors \(its tasks: topics\)$"):
        load_stream(build_config("tiny", [f"data.benchmark={tmp_path / 'benchmarks' / 'CL_Benchmark'}", "data.tasks=[colors]"]))


# ------------------------------------------------------------------ 5. an empty JSONL file


@pytest.mark.parametrize("text", ["", "\n\n", '{"task": "ok", "labels": ["a", "b"]}\n'])
def test_a_jsonl_file_without_rows_says_so(tmp_path, text):
    path = tmp_path / "ok.jsonl"
    path.write_text(text)
    for kind in ("classify", "text", "generate"):
        with pytest.raises(SureclError) as err:
            load_jsonl_task(path, kind)
        assert str(err.value) == f"{path}: holds no rows"
    with pytest.raises(SureclError, match=r"ok.jsonl: holds no rows$"):
        load_stream(build_config("tiny", ["data.benchmark=none", f"data.jsonl=[{path}]"]))
