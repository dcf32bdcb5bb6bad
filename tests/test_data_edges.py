"""Edges of how a user's own data is read, where a run went on with other data than the user's:
a folder's files grouped into splits by keyword, a balanced sample that always left out the same
classes, an empty YAML value read as the text "None", CSV fields read as numbers, tasks= beside
data.* options that were ignored, in-memory datasets all named "csv", ClassLabel names taken
unstripped, a label seen only in the test split, "~" in a data path, and rows a file marks
"test" trained on."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from pathlib import Path

import datasets
import pytest
from datasets import ClassLabel, Dataset, DatasetDict

from surecl.config import HFTaskConfig, build_config
from surecl.data.hf import load_hf_task
from surecl.data.jsonl import load_jsonl_task
from surecl.data.loading import caller_stream, caller_tasks, load_stream
from surecl.data.task import Example, Task, prepare_stream, subsample
from surecl.data.tiny import tiny_stream
from surecl.errors import SureclError


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """``load_dataset`` caches what it reads: into the test's folder, never the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))
    datasets.disable_progress_bars()  # save_to_disk / to_parquet: the test's bars, not surecl's


def csv(path: Path, rows: list[tuple[str, str]], header: str = "text,label") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return path


def pairs(task: Task, split: str) -> list[tuple[str, str]]:
    return [(ex.sentence, ex.label) for ex in getattr(task, split)]


def one_line_error(call, *words: str) -> str:
    with pytest.raises(SureclError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


# ------------------------------------------------------------------ 1. a folder's splits come from its file names


def test_a_folder_of_files_reads_each_file_as_the_split_its_name_names(tmp_path, caplog):
    """datasets grouped eval.csv and test_old.csv into the test split (test = c, d, h, e, f, g)
    and skipped the fewer of two formats: every file is now its own split, read, or left out with
    a warning naming it (a hub snapshot's validation file is usual)."""
    fold = tmp_path / "fold"
    csv(fold / "train.csv", [("a", "x"), ("b", "y")])
    csv(fold / "test.csv", [("c", "x"), ("d", "y")])
    csv(fold / "eval.csv", [("e", "x"), ("f", "y"), ("g", "x")])
    csv(fold / "test_old.csv", [("h", "x")])
    with caplog.at_level(logging.WARNING, logger="surecl"):
        task = load_hf_task(HFTaskConfig(path=str(fold)))
    assert pairs(task, "train") == [("a", "x"), ("b", "y")] and pairs(task, "test") == [("c", "x"), ("d", "y")]
    (said,) = [r.getMessage() for r in caplog.records]
    assert "data.hf[0].path" in said and "eval.csv and 1 more, which are not read" in said and "split 'eval'" in said
    caplog.clear()
    (fold / "eval.csv").unlink()
    (fold / "test_old.csv").unlink()
    with caplog.at_level(logging.WARNING, logger="surecl"):
        task = load_hf_task(HFTaskConfig(path=str(fold)))
    assert pairs(task, "test") == [("c", "x"), ("d", "y")] and not caplog.records
    # another name for the test split reads that file
    csv(fold / "eval.csv", [("e", "x"), ("f", "y")])
    assert pairs(load_hf_task(HFTaskConfig(path=str(fold / "eval.csv"), test_fraction=0.5)), "train") in ([("e", "x")], [("f", "y")])
    (fold / "test.csv").unlink()
    assert pairs(load_hf_task(HFTaskConfig(path=str(fold), test_split="eval")), "test") == [("e", "x"), ("f", "y")]

    # mixed formats: a file of the minority format was skipped
    fold2 = tmp_path / "fold2"
    fold2.mkdir()
    Dataset.from_dict({"text": ["a", "b"], "label": ["x", "y"]}).to_parquet(str(fold2 / "train.parquet"))
    Dataset.from_dict({"text": ["c", "d"], "label": ["x", "y"]}).to_parquet(str(fold2 / "test.parquet"))
    csv(fold2 / "train_extra.csv", [("NA", "x"), ("q", "y")])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="surecl"):
        load_hf_task(HFTaskConfig(path=str(fold2)))
    assert ["train_extra.csv, which is not read" in r.getMessage() for r in caplog.records] == [True]
    (fold2 / "train_extra.csv").rename(fold2 / "test.csv")  # two formats in one split
    one_line_error(lambda: load_hf_task(HFTaskConfig(path=str(fold2))), "'test' files", "more than one format")
    (fold2 / "test.parquet").unlink()  # a split per format is read
    task = load_hf_task(HFTaskConfig(path=str(fold2)))
    assert pairs(task, "train") == [("a", "x"), ("b", "y")] and pairs(task, "test") == [("NA", "x"), ("q", "y")]

    # hub shards are one split, in shard order
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    Dataset.from_dict({"text": ["a"], "label": ["x"]}).to_parquet(str(hub / "train-00000-of-00002.parquet"))
    Dataset.from_dict({"text": ["b"], "label": ["y"]}).to_parquet(str(hub / "train-00001-of-00002.parquet"))
    Dataset.from_dict({"text": ["c", "d"], "label": ["x", "y"]}).to_parquet(str(hub / "test-00000-of-00001-5a1b2c3d.parquet"))
    (tmp_path / "hub" / "README.md").write_text("---\nlicense: mit\n---\n")
    task = load_hf_task(HFTaskConfig(path=str(tmp_path / "hub")))
    assert task.name == "hub" and pairs(task, "train") == [("a", "x"), ("b", "y")] and pairs(task, "test") == [("c", "x"), ("d", "y")]

    # a saved DatasetDict folder reads as before
    DatasetDict(train=Dataset.from_dict({"text": ["a", "b"], "label": ["x", "y"]}),
                test=Dataset.from_dict({"text": ["c", "d"], "label": ["x", "y"]}),
                validation=Dataset.from_dict({"text": ["e"], "label": ["x"]})).save_to_disk(str(tmp_path / "saved"))
    task = load_hf_task(HFTaskConfig(path=str(tmp_path / "saved")))
    assert pairs(task, "train") == [("a", "x"), ("b", "y")] and pairs(task, "test") == [("c", "x"), ("d", "y")]


# ------------------------------------------------------------------ 2. balanced sampling


def round_robin(rows: list[Example], n: int, rng: random.Random) -> list[Example]:
    """The balanced draw as it was: the labels of a partial last round taken in sorted order."""
    pools: dict[str, list[Example]] = {}
    for ex in rows:
        pools.setdefault(ex.label, []).append(ex)
    ordered = [pools[k] for k in sorted(pools)]
    for pool in ordered:
        rng.shuffle(pool)
    out: list[Example] = []
    depth = 0
    while len(out) < n:
        for pool in ordered:
            if depth < len(pool) and len(out) < n:
                out.append(pool[depth])
        depth += 1
    rng.shuffle(out)
    return out


def test_a_balanced_sample_smaller_than_its_classes_draws_which_classes_by_seed():
    """150 intents x 20 rows, 100 test rows: every seed held exactly intent_000..intent_099."""
    labels = [f"intent_{i:03d}" for i in range(150)]
    rows = [Example(f"s {lab} {j}", lab) for lab in labels for j in range(20)]
    task = Task("clinc", "x", labels, rows, rows)
    held = []
    for seed in (1, 2, 3):
        [s] = prepare_stream([task], 240, 100, True, seed)
        counts = Counter(ex.label for ex in s.test)
        assert len(s.test) == 100 and len(counts) == 100 and set(counts.values()) == {1}
        assert max(Counter(ex.label for ex in s.train).values()) - min(Counter(ex.label for ex in s.train).values()) <= 1
        held.append(frozenset(counts))
    assert len(set(held)) == 3 and held[0] != frozenset(labels[:100])
    # a partial last round with fewer classes than rows keeps the sample drawn before (the
    # default stream's tweets: 3 classes, 100 rows): counts within one of each other
    three = [Example(f"t {i}", "abc"[i % 3]) for i in range(300)]
    for seed in range(3):
        got = subsample(list(three), 100, random.Random(seed), True)
        assert got == round_robin(list(three), 100, random.Random(seed))
        assert sorted(Counter(ex.label for ex in got).values()) == [33, 33, 34]


@pytest.mark.parametrize("classes, n", [(4, 200), (5, 200), (10, 200), (2, 100), (3, 240), (14, 196), (14, 200), (6, 100)])
def test_a_balanced_sample_that_holds_every_class_is_the_sample_drawn_before(classes, n):
    """At least as many rows as classes: the very rows, in the very order, the draw gave before
    the choice of classes for a smaller sample was randomised."""
    rows = [Example(f"r {i}", f"c{i % classes}") for i in range(classes * 100)]
    for seed in range(3):
        got = subsample(list(rows), n, random.Random(f"{seed}:t"), True)
        assert got == round_robin(list(rows), n, random.Random(f"{seed}:t"))
    uneven = [Example(f"u {i}", "a") for i in range(50)] + [Example(f"v {i}", "b") for i in range(3)]
    assert subsample(uneven, 20, random.Random(5), True) == round_robin(uneven, 20, random.Random(5))  # b runs out: no partial round


# ------------------------------------------------------------------ 3. an empty YAML value is no string


@pytest.mark.parametrize("override", [
    "data.hf=[{path: a.csv, test_fraction: 0.25, instruction: }]",
    "data.hf=[{path: a.csv, instruction: null}]",
    "data.hf=[{path: a.csv, task: ~}]",
    "data.hf=[{path: a.csv, metric: }]",
    "data.hf=[{path: a.csv, labels: [~, x]}]",
    "data.tasks=[null]",
])
def test_an_empty_yaml_value_where_a_string_is_meant_is_refused(override):
    one_line_error(lambda: build_config("tiny", [override]), "expected a string, got no value", "remove the key")


def test_an_empty_value_in_a_config_file_and_a_jsonl_task_that_is_no_string_are_refused(tmp_path):
    (tmp_path / "my.yaml").write_text("kind: setting\ndata:\n  benchmark: none\n  hf:\n    - path: a.csv\n      test_fraction: 0.25\n"
                                      "      instruction:\n")
    one_line_error(lambda: build_config(f"tiny,seq_lora,{tmp_path / 'my.yaml'}"), "data.hf[0].instruction", "got no value")
    rows = "".join(json.dumps({"sentence": f"s{i}", "label": "ab"[i % 2], "split": "test" if i >= 4 else "train"}) + "\n" for i in range(6))
    for header in ({"task": None, "labels": ["a", "b"]}, {"task": 5}, {"task": {"a": 1}}):
        (tmp_path / "t.jsonl").write_text(json.dumps(header) + "\n" + rows)
        one_line_error(lambda: load_jsonl_task(tmp_path / "t.jsonl"), "header 'task' must be a string")
    (tmp_path / "t.jsonl").write_text(json.dumps({"labels": ["a", "b"]}) + "\n" + rows)
    assert load_jsonl_task(tmp_path / "t.jsonl").name == "t"


# ------------------------------------------------------------------ 4. a CSV field is its text


def test_a_csv_field_is_its_text_even_where_it_looks_like_a_number(tmp_path):
    codes = load_hf_task(HFTaskConfig(path=str(csv(tmp_path / "codes.csv", [(f"r{i}", ["1", "01"][i % 2]) for i in range(8)])),
                                      test_fraction=0.25))
    assert codes.labels == ["01", "1"] and {ex.sentence: ex.label for ex in codes.train + codes.test} == {f"r{i}": ["1", "01"][i % 2] for i in range(8)}
    flags = load_hf_task(HFTaskConfig(path=str(csv(tmp_path / "tf.csv", [(f"r{i}", ["True", "False"][i % 2]) for i in range(8)])),
                                      test_fraction=0.25))
    assert flags.labels == ["False", "True"]
    numbers = load_hf_task(HFTaskConfig(path=str(csv(tmp_path / "num.csv", [(str(i), "xy"[i % 2]) for i in range(8)])), test_fraction=0.25))
    assert sorted(ex.sentence for ex in numbers.train + numbers.test) == [str(i) for i in range(8)]
    # generation targets that are numbers are their text
    sums = load_hf_task(HFTaskConfig(path=str(csv(tmp_path / "sums.csv", [(f"{i}+{i}", f"0{2 * i}") for i in range(8)])), test_fraction=0.25),
                        kind="generate")
    assert {ex.sentence: ex.label for ex in sums.train + sums.test}["3+3"] == "06"
    # integers are still positions among labels given as names, and the numbers themselves else
    polar = csv(tmp_path / "polar.csv", [(f"r{i}", str(i % 2)) for i in range(8)])
    named = load_hf_task(HFTaskConfig(path=str(polar), labels=["neg", "pos"], test_fraction=0.25))
    assert {ex.sentence: ex.label for ex in named.train + named.test} == {f"r{i}": ["neg", "pos"][i % 2] for i in range(8)}
    assert load_hf_task(HFTaskConfig(path=str(polar), test_fraction=0.25)).labels == ["0", "1"]
    # a folder of CSV files too
    fold = tmp_path / "zip"
    csv(fold / "train.csv", [("a", "01"), ("b", "02"), ("c", "01")])
    csv(fold / "test.csv", [("d", "02"), ("e", "01")])
    assert load_hf_task(HFTaskConfig(path=str(fold))).labels == ["01", "02"]


# ------------------------------------------------------------------ 5. tasks= and the data options


def test_tasks_passed_in_follow_data_tasks_and_refuse_data_files():
    tasks = tiny_stream()
    cfg = build_config("tiny,seq_lora", ["data.tasks=[numbers,colors]"])
    assert [t.name for t in caller_stream(tasks, cfg)] == ["numbers", "colors"]
    one_line_error(lambda: caller_stream(tasks, build_config("tiny,seq_lora", ["data.tasks=[numbers,clouds]"])), "data.tasks", "clouds")
    jsonl, hf = (build_config("tiny,seq_lora", [o]) for o in ("data.jsonl=[/nonexistent.jsonl]", "data.hf=[x.csv]"))
    one_line_error(lambda: caller_stream(tasks, jsonl), "tasks:", "data.jsonl is set too", "tasks=")
    one_line_error(lambda: caller_stream(tasks, hf), "tasks:", "data.hf is set too")
    assert [t.name for t in caller_stream(tasks, build_config("tiny,seq_lora"))] == [t.name for t in tasks]


# ------------------------------------------------------------------ 6. in-memory datasets read from files


def test_two_datasets_loaded_from_files_are_named_by_position(tmp_path):
    a = csv(tmp_path / "a.csv", [(f"r{i}", "xy"[i % 2]) for i in range(8)])
    b = csv(tmp_path / "b.csv", [(f"q{i}", "uv"[i % 2]) for i in range(8)])
    first = datasets.load_dataset("csv", data_files={"train": str(a), "test": str(a)})
    second = datasets.load_dataset("csv", data_files={"train": str(b), "test": str(b)})
    assert first["train"].info.dataset_name == "csv"
    cfg = build_config("tiny,seq_lora", ["data.n_train=0", "data.n_test=0"])
    assert [t.name for t in caller_tasks([first, second], cfg)] == ["task0", "task1"]
    assert [t.labels for t in caller_stream([first, second], cfg)] == [["x", "y"], ["u", "v"]]
    same = Task.from_hf(first, "mine")
    one_line_error(lambda: caller_stream([same, Task.from_hf(second, "mine")], cfg), "named twice", "mine", "Task.from_hf(dataset, name=...)")


# ------------------------------------------------------------------ 7. ClassLabel names


def test_class_label_names_are_taken_stripped_and_composed(tmp_path):
    features = datasets.Features({"text": datasets.Value("string"), "label": ClassLabel(names=["pos ", "cafe\u0301"])})
    Dataset.from_dict({"text": [f"r{i}" for i in range(8)], "label": [0, 1] * 4}, features=features).save_to_disk(str(tmp_path / "cl"))
    task = load_hf_task(HFTaskConfig(path=str(tmp_path / "cl"), test_fraction=0.25))
    assert task.labels == ["pos", "caf\u00e9"] and {ex.label for ex in task.train + task.test} == {"pos", "caf\u00e9"}
    given = load_hf_task(HFTaskConfig(path=str(tmp_path / "cl"), test_fraction=0.25, labels=["pos", "caf\u00e9"]))
    assert given.train == task.train and given.test == task.test
    twice = datasets.Features({"text": datasets.Value("string"), "label": ClassLabel(names=["a", "a "])})
    Dataset.from_dict({"text": [f"r{i}" for i in range(8)], "label": [0, 1] * 4}, features=twice).save_to_disk(str(tmp_path / "two"))
    one_line_error(lambda: load_hf_task(HFTaskConfig(path=str(tmp_path / "two"), test_fraction=0.25)), "ClassLabel names", "'a' twice")


# ------------------------------------------------------------------ 8. a label seen only in the test split


def test_a_label_seen_only_in_the_test_split_is_warned_about(tmp_path, caplog):
    rows = [{"sentence": f"s{i}", "label": ["positive", "negative"][i % 2]} for i in range(6)]
    rows += [{"sentence": "t1", "label": "positive", "split": "test"}, {"sentence": "t2", "label": "postive", "split": "test"}]
    path = tmp_path / "typo.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING, logger="surecl"):
        task = load_jsonl_task(path)
    assert task.labels == ["negative", "positive", "postive"]  # still a class: it may be meant
    [record] = [r for r in caplog.records if r.name == "surecl"]
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in message
    assert all(w in message for w in ("task typo", "'postive'", "only in its test split", "labels")), message
    caplog.clear()
    fold = tmp_path / "moods"
    csv(fold / "train.csv", [("a", "x"), ("b", "y")])
    csv(fold / "test.csv", [("c", "x"), ("d", "z")])
    with caplog.at_level(logging.WARNING, logger="surecl"):
        load_hf_task(HFTaskConfig(path=str(fold)))
    assert any("'z'" in r.getMessage() and "data.hf[0].labels" in r.getMessage() for r in caplog.records), caplog.records
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="surecl"):  # labels given, or every test label trained on: nothing to say
        load_hf_task(HFTaskConfig(path=str(fold), labels=["x", "y", "z"]))
        (fold / "test.csv").write_text("text,label\nc,x\nd,y\n")
        load_hf_task(HFTaskConfig(path=str(fold)))
    assert not [r for r in caplog.records if r.name == "surecl"]


# ------------------------------------------------------------------ 9. "~" in data.jsonl and data.benchmark


def test_a_home_relative_jsonl_or_benchmark_path_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    rows = [{"task": "mine", "labels": ["a", "b"]}] + [{"sentence": f"s{i}", "label": "ab"[i % 2], "split": "test" if i >= 4 else "train"}
                                                       for i in range(6)]
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [t.name for t in load_stream(build_config("tiny", ["data.benchmark=none", "data.jsonl=[~/mine.jsonl]"]))] == ["mine"]
    bench = tmp_path / "bench"
    (bench / "TC" / "topics").mkdir(parents=True)
    (bench / "instruction_config.json").write_text(json.dumps({"TC": [{"instruction": "Topic? "}]}))
    for split in ("train", "test"):
        (bench / "TC" / "topics" / f"{split}.json").write_text(json.dumps([{"sentence": f"t{i}", "label": "xy"[i % 2]} for i in range(4)]))
    (bench / "TC" / "topics" / "labels.json").write_text(json.dumps(["x", "y"]))
    assert [t.name for t in load_stream(build_config("tiny", ["data.benchmark=~/bench", "data.tasks=[topics]"]))] == ["topics"]


# ------------------------------------------------------------------ 10. a split column that marks test rows


def test_a_split_column_marking_test_rows_is_refused_in_a_data_hf_entry(tmp_path):
    """A surecl JSONL file given as data.hf: its split column was ignored, so rows marked test
    could be trained on."""
    rows = [{"sentence": f"s{i}", "label": "ab"[i % 2], "split": "test" if i >= 6 else "train"} for i in range(8)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    one_line_error(lambda: load_hf_task(HFTaskConfig(path=str(path), text_column="sentence", test_fraction=0.25)),
                   "data.hf[0]", "'split' column", "2 rows 'test'", "data.jsonl")
    assert len(load_jsonl_task(path).test) == 2  # data.jsonl honours it
    path.write_text("".join(json.dumps({**r, "split": "train"}) + "\n" for r in rows))  # nothing marked test: read as before
    assert len(load_hf_task(HFTaskConfig(path=str(path), text_column="sentence", test_fraction=0.25)).test) == 2


def test_a_benchmark_task_with_fewer_train_rows_than_asked_is_named(tmp_path):
    """O-LoRA's CL_Benchmark holds 250 train rows for CB where lnt asks 1,000: the task is taken
    whole and the run (and its fractional buffer) comes out smaller than the protocol says; the
    run and the dry run name such tasks once (tasks given in other ways are not counted)."""
    from surecl.data.loading import short_tasks_warning
    from surecl.plan import describe

    bench = tmp_path / "bench"
    (bench / "TC").mkdir(parents=True)
    (bench / "instruction_config.json").write_text(json.dumps({"TC": [{"instruction": "Topic? "}]}))
    for name, n in (("small", 6), ("large", 40)):
        (bench / "TC" / name).mkdir()
        for split in ("train", "test"):
            (bench / "TC" / name / f"{split}.json").write_text(json.dumps([{"sentence": f"{name}{i}", "label": "xy"[i % 2]} for i in range(n)]))
        (bench / "TC" / name / "labels.json").write_text(json.dumps(["x", "y"]))
    cfg = build_config("tiny,seq_lora", [f"data.benchmark={bench}", "data.tasks=[small,large]", "data.n_train=20"])
    tasks = load_stream(cfg)
    assert [len(t.train) for t in tasks] == [6, 20]
    said = "data.n_train=20: this task holds fewer train rows, taken whole: small 6 (the run's steps and a fractional buffer follow the rows taken)"
    assert short_tasks_warning(tasks, 20) == said
    assert short_tasks_warning(load_stream(build_config("tiny", [f"data.benchmark={bench}", "data.tasks=[small,large]", "data.n_train=6"])), 6) is None
    assert short_tasks_warning(load_stream(build_config("tiny")), 240) is None  # the tiny stream's 96 rows: not a benchmark folder's
    assert f"warning: {said}" in describe(cfg).splitlines()


def test_orders_a_folder_lacks_tasks_of_are_named_and_not_swept_as_two(tmp_path, capsys):
    """A CL_Benchmark copy without yahoo: data.allow_missing runs orders 1 and 2 as one task list
    (they differ only in where yahoo sits), so a sweep over both ran one stream under two names,
    which the report counted as independent units; nothing said a task was left out. The run and
    the dry run now name the absent tasks, the sweep refuses the two orders, and the paper report
    says which of an order's tasks its runs did not train."""
    from surecl.cli import main
    from surecl.data.loading import missing_tasks_warning
    from surecl.plan import describe

    bench = tmp_path / "bench"
    (bench / "instruction_config.json").parent.mkdir(parents=True)
    (bench / "instruction_config.json").write_text(json.dumps({"TC": [{"instruction": "Topic? "}], "SC": [{"instruction": "Mood? "}]}))
    for group, name in (("TC", "dbpedia"), ("SC", "amazon"), ("TC", "agnews")):
        (bench / group / name).mkdir(parents=True)
        for split in ("train", "test"):
            (bench / group / name / f"{split}.json").write_text(json.dumps([{"sentence": f"{name}{i}", "label": "xy"[i % 2]} for i in range(8)]))
        (bench / group / name / "labels.json").write_text(json.dumps(["x", "y"]))
    base = [f"data.benchmark={bench}", "data.allow_missing=true", "data.n_train=8", "data.n_test=8"]
    one, two = (load_stream(build_config("tiny,seq_lora", [*base, f"data.order={o}"])) for o in ("1", "2"))
    assert [t.name for t in one] == [t.name for t in two] == ["dbpedia", "amazon", "agnews"]
    said = "order 1: the benchmark folder lacks yahoo; the stream runs 3 of its 4 tasks (data.allow_missing), which is not the order's stream"
    assert missing_tasks_warning(one, "1") == said
    assert f"warning: {said}" in describe(build_config("tiny,seq_lora", [*base, "data.order=1"])).splitlines()
    assert missing_tasks_warning(load_stream(build_config("tiny,seq_lora", [*base, "data.tasks=[amazon,agnews]"])), "default") is None
    # the folder's own order (MANIFEST.json, order default) names what it lacks too
    (bench / "MANIFEST.json").write_text(json.dumps({"order": ["dbpedia", "yahoo", "agnews"]}))
    kept = load_stream(build_config("tiny,seq_lora", [*base, "data.order=default"]))
    assert [t.name for t in kept] == ["dbpedia", "agnews"]
    assert missing_tasks_warning(kept, "default").startswith("order default: the benchmark folder lacks yahoo; the stream runs 2 of its 3")
    (bench / "MANIFEST.json").unlink()
    out = tmp_path / "sweep"
    argv = ["sweep", "--config", "tiny", "--methods", "seq_lora", "--orders", "1,2", "--seeds", "0", "--out", str(out), "--quiet", *base]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "orders 1 and 2 of row seq_lora train the same task list (dbpedia, amazon, agnews)" in err[0], err
    assert not (out / "sweep.json").exists()
    # the report names what an order's runs left out
    from surecl.report import paper_report

    runs = tmp_path / "runs"
    for seed in (0, 1):
        d = runs / f"seed{seed}"
        d.mkdir(parents=True)
        a = [[80.0, None, None], [70.0, 80.0, None], [60.0, 70.0, 80.0]]
        d.joinpath("results.json").write_text(json.dumps({
            "tasks": ["dbpedia", "amazon", "agnews"], "metric": "accuracy", "accuracy_matrix": a, "fp": 70.0, "ap": 80.0,
            "forgetting": 10.0, "bwt": -10.0, "avg_incremental": 75.0,
            "config": {"preset": "seq_lora", "method": "sequential", "seed": seed, "data": {"order": "1", "draw": "order"},
                       "dual": {"enabled": False}, "replay": {"policy": "none"}}}))
    md = paper_report([runs], claims="none").markdown()
    assert "- Order-1: the runs trained 3 of its 4 tasks; absent: yahoo" in md


def test_a_folder_of_one_file_named_after_no_split_is_the_train_split(tmp_path, caplog):
    """A folder holding only reviews.csv: datasets read it as the train split, and so it stays
    (the per-file split rule had warned it away and then found no train split)."""
    fold = tmp_path / "f1"
    csv(fold / "reviews.csv", [("a", "neg"), ("b", "pos"), ("c", "neg"), ("d", "pos")])
    with caplog.at_level(logging.WARNING, logger="surecl"):
        task = load_hf_task(HFTaskConfig(path=str(fold), test_fraction=0.5))
    assert len(task.train) == 2 and len(task.test) == 2 and task.labels == ["neg", "pos"] and not caplog.records


TINY_LABELS = ("warm", "cool")  # words the tiny model's tokenizer knows


def _bench(root, tasks, labels=("x", "y")):
    """A CL_Benchmark-style folder: ``tasks`` = [(group, name)], 8 rows per split, two labels."""
    (root / "instruction_config.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "instruction_config.json").write_text(json.dumps({g: [{"instruction": "Which? "}] for g, _ in tasks}))
    for group, name in tasks:
        (root / group / name).mkdir(parents=True)
        for split in ("train", "test"):
            (root / group / name / f"{split}.json").write_text(json.dumps([{"sentence": f"{name}{i}", "label": labels[i % 2]} for i in range(8)]))
        (root / group / name / "labels.json").write_text(json.dumps(list(labels)))
    return root


def test_a_task_folder_named_decomposed_is_found_by_its_composed_name(tmp_path):
    """A folder made on macOS is named NFD; data.tasks and a manifest's order are read NFC:
    "lacks task été" although the folder was there."""
    bench = _bench(tmp_path / "bench", [("SC", "e\u0301te\u0301"), ("TC", "topics")])
    base = [f"data.benchmark={bench}", "data.n_train=4", "data.n_test=4"]
    assert [t.name for t in load_stream(build_config("tiny,seq_lora", [*base, "data.tasks=[été,topics]"]))] == ["été", "topics"]
    (bench / "MANIFEST.json").write_text(json.dumps({"order": ["topics", "été"]}))
    assert [t.name for t in load_stream(build_config("tiny,seq_lora", base))] == ["topics", "été"]


def test_a_manifest_without_an_order_means_every_task(tmp_path):
    """README: order default is the manifest's order, else every task the folder holds; a manifest
    without "order" gave "none of the tasks  is present"."""
    bench = _bench(tmp_path / "bench", [("SC", "moods"), ("TC", "topics")])
    (bench / "MANIFEST.json").write_text(json.dumps({"version": 1, "sources": {}}))
    assert [t.name for t in load_stream(build_config("tiny,seq_lora", [f"data.benchmark={bench}", "data.n_train=4"]))] == ["moods", "topics"]


def test_a_resume_whose_prompts_are_built_otherwise_stops(tmp_path, tiny_cache, monkeypatch):
    """The task's rows are the same but its prompts are not (here its folder moved to another
    group under data.task_prefix, whose prompts name the group; a tokenizer that now adds a BOS
    is the same case): the checkpoint records each task's encoded rows, and the resume stops in
    one line instead of training the rest of the run on other inputs."""
    from tiny_runs import stopped_at

    from surecl.trainer import run

    bench = _bench(tmp_path / "bench", [("red", "b"), ("green", "c")], TINY_LABELS)  # groups the tiny tokenizer reads (Task:red)
    cfg = build_config("tiny,seq_lora", [f"data.benchmark={bench}", "data.n_train=8", "data.n_test=4", "data.task_prefix=true",
                                         "train.checkpoint_every=1", "eval.before=false"])
    stopped_at(monkeypatch, "step:1:0", lambda: run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache))
    (bench / "blue").mkdir()
    (bench / "red" / "b").rename(bench / "blue" / "b")
    (bench / "instruction_config.json").write_text(json.dumps({g: [{"instruction": "Which? "}] for g in ("blue", "green")}))
    with pytest.raises(SureclError, match=r"the prompts of task b are built otherwise than when stage-0001"):
        run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    (bench / "blue" / "b").rename(bench / "red" / "b")
    (bench / "instruction_config.json").write_text(json.dumps({g: [{"instruction": "Which? "}] for g in ("red", "green")}))
    assert run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)["accuracy_matrix"][1][1] is not None


def test_a_checkpoint_naming_its_tasks_decomposed_resumes(tmp_path, tiny_cache, monkeypatch):
    """A run started on a folder named NFD (macOS) recorded its task names so; they are read NFC
    now, and its checkpoint still resumes (it was "a different task stream")."""
    import unicodedata

    from tiny_runs import stopped_at

    from surecl.trainer import run

    bench = _bench(tmp_path / "bench", [("SC", "été"), ("TC", "topics")], TINY_LABELS)
    cfg = build_config("tiny,seq_lora", [f"data.benchmark={bench}", "data.n_train=8", "data.n_test=4", "train.checkpoint_every=1",
                                         "eval.before=false"])
    stopped_at(monkeypatch, "step:1:0", lambda: run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache))
    for meta in (tmp_path / "run" / "checkpoints").glob("*/meta.json"):  # as an earlier surecl wrote it
        text = meta.read_text(encoding="utf-8")
        meta.write_text(text.replace(json.dumps("été")[1:-1], json.dumps(unicodedata.normalize("NFD", "été"))[1:-1]).replace("été", unicodedata.normalize("NFD", "été")), encoding="utf-8")
    res = run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert res["tasks"] == ["topics", "été"] and res["accuracy_matrix"][1][1] is not None
