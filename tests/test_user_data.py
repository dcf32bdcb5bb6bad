"""Edges of a user's own data where a result would be silently wrong: integer labels read two
ways, CSV words read as missing, a metric or a task list that is accepted and ignored, YAML
booleans where a label was meant, malformed JSONL that escaped as a traceback, and the caller's
own Task objects changed by a run."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from surecl.config import HFTaskConfig, build_config
from surecl.data.hf import load_hf_task
from surecl.data.jsonl import load_jsonl_task
from surecl.data.loading import caller_stream, caller_tasks, load_stream
from surecl.data.task import Example, Task
from surecl.errors import SureclError


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """``load_dataset`` caches what it reads: into the test's folder, never the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))


def write_csv(path: Path, rows: list[tuple[str, object]]) -> Path:
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return path


def read(task: Task) -> dict[str, str]:
    return {ex.sentence: ex.label for ex in task.train + task.test}


def test_given_labels_that_are_numbers_name_the_integers_not_positions(tmp_path):
    """A 1-3 rating column with labels ["1", "2", "3"]: 1 stays "1" (as a position it would read
    "2", and 3, past the end, "3": two classes merged, every label moved by one)."""
    rows = [(f"row {i}", i % 3 + 1) for i in range(12)]
    csv = write_csv(tmp_path / "stars.csv", rows)
    task = load_hf_task(HFTaskConfig(path=str(csv), labels=["1", "2", "3"], test_fraction=0.25))
    assert read(task) == {t: str(y) for t, y in rows} and task.labels == ["1", "2", "3"]
    # names are positions, as documented
    named = load_hf_task(HFTaskConfig(path=str(write_csv(tmp_path / "polar.csv", [(f"row {i}", i % 2) for i in range(8)])),
                                      labels=["neg", "pos"], test_fraction=0.25))
    assert read(named) == {f"row {i}": ["neg", "pos"][i % 2] for i in range(8)}
    # numbers mixed with names could be either: refused in one line
    with pytest.raises(SureclError, match=r"mix numbers with names") as err:
        load_hf_task(HFTaskConfig(path=str(csv), labels=["1", "two", "3"], test_fraction=0.25))
    assert "\n" not in str(err.value)


def test_a_csv_field_is_its_text_and_only_an_empty_one_is_missing(tmp_path):
    csv = write_csv(tmp_path / "region.csv", [(f"row {i}", ["NA", "EU", "None"][i % 3]) for i in range(9)])
    task = load_hf_task(HFTaskConfig(path=str(csv), test_fraction=0.34))
    assert task.labels == ["EU", "NA", "None"] and sorted(set(read(task).values())) == ["EU", "NA", "None"]
    write_csv(tmp_path / "gap.csv", [("a", "x"), ("b", ""), ("c", "y"), ("d", "x")])
    with pytest.raises(SureclError, match=r"row 1: no label"):
        load_hf_task(HFTaskConfig(path=str(tmp_path / "gap.csv"), test_fraction=0.25))


def test_a_generation_metric_on_a_classification_entry_is_refused(tmp_path):
    csv = write_csv(tmp_path / "qa.csv", [(f"q {i}", f"a{i % 2}") for i in range(8)])
    with pytest.raises(SureclError, match=r"metric 'exact_match' does not fit a classify task"):
        load_hf_task(HFTaskConfig(path=str(csv), test_fraction=0.25, metric="exact_match"))


def jsonl_task(path: Path, name: str) -> Path:
    rows = [{"task": name, "instruction": "Which? ", "labels": ["warm", "cool"]}]
    rows += [{"sentence": f"{name} {i}", "label": ["warm", "cool"][i % 2], "split": "test" if i >= 6 else "train"} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_data_tasks_orders_a_stream_of_the_users_own_tasks(tmp_path, capsys):
    a, b = jsonl_task(tmp_path / "alpha.jsonl", "alpha"), jsonl_task(tmp_path / "beta.jsonl", "beta")
    base = ["data.benchmark=none", f"data.jsonl=[{a},{b}]"]
    assert [t.name for t in load_stream(build_config("tiny", base))] == ["alpha", "beta"]
    assert [t.name for t in load_stream(build_config("tiny", [*base, "data.tasks=[beta,alpha]"]))] == ["beta", "alpha"]
    assert [t.name for t in load_stream(build_config("tiny", [*base, "data.tasks=[beta]"]))] == ["beta"]
    with pytest.raises(SureclError, match=r"data.tasks: data.jsonl / data.hf has no task gamma"):
        load_stream(build_config("tiny", [*base, "data.tasks=[gamma]"]))
    # orders these streams do not have would make every "order" of a sweep the same stream,
    # counted by a report as independent units: refused before anything runs
    from surecl.cli import main

    for extra, words in (([], "orders 1, 2 of the tiny benchmark are one stream"), (base, "of a stream of data.jsonl / data.hf tasks")):
        out = tmp_path / "sweep"
        argv = ["sweep", "--config", "tiny", "--methods", "seq_lora", "--orders", "1,2", "--seeds", "0", "--out", str(out), "--quiet", *extra]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not (out / "sweep.json").exists()
    # a named order with its task list (as a sweep plan writes it) is that list
    assert [t.name for t in load_stream(build_config("tiny", [*base, "data.order=b", "data.tasks=[beta,alpha]"]))] == ["beta", "alpha"]


@pytest.mark.parametrize("override", ["data.hf=[{path: x.csv, labels: [no, yes], test_fraction: 0.2}]", "data.tasks=[on, off]"])
def test_a_yaml_boolean_where_a_string_is_meant_is_refused(override):
    """YAML 1.1 reads an unquoted no / yes / on / off as a boolean: "no" would become "False"."""
    with pytest.raises(SureclError, match=r"expected a string, got the boolean .*quote it") as err:
        build_config("tiny", [override])
    assert "\n" not in str(err.value)
    quoted = build_config("tiny", ['data.hf=[{path: x.csv, labels: ["no", "yes"], test_fraction: 0.2}]'])
    assert quoted.data.hf[0].labels == ["no", "yes"]


def test_an_unquoted_yaml_number_where_a_string_is_meant_is_its_text(tmp_path):
    """YAML 1.1 reads an unquoted 010 as 8, 0x1F as 31, 1.50 as 1.5 and 1:30 as 90: labels and
    task names written that way are the text as written (they were "8", "31", "1.5", "90")."""
    f = tmp_path / "c.yaml"
    f.write_text("data:\n  tasks: [010, 0x1F]\n  hf:\n  - {path: x.csv, labels: [010, 1.50, 1:30, 7], test_fraction: 0.2}\n"
                 "replay:\n  ratio: 1:2\n")
    cfg = build_config(f"tiny,{f}")
    assert cfg.data.tasks == ["010", "0x1F"] and cfg.data.hf[0].labels == ["010", "1.50", "1:30", "7"]
    assert cfg.replay.ratio == "1:2"
    assert build_config("tiny", ["data.hf=[{path: x.csv, labels: [010, 020], test_fraction: 0.2}]"]).data.hf[0].labels == ["010", "020"]
    # a number where a number is declared reads as YAML reads it; config.yaml writes it back
    cfg = build_config("tiny", ["seed=010", "train.lr=1.50e-3"])
    assert cfg.seed == 8 and cfg.train.lr == 1.5e-3 and type(cfg.seed) is int
    assert build_config(_saved(tmp_path, cfg)).seed == 8


def _saved(folder: Path, cfg) -> str:
    path = folder / "saved.yaml"
    path.write_text(cfg.to_yaml())
    return str(path)


@pytest.mark.parametrize("line, words", [
    ('{"sentence": "x", "label": "warm", "split": ["test"]}', "split must be 'train' or 'test'"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    # undecodable values: text cut inside a UTF-16 pair, an integer beyond json's 4300 digits
    ('{"sentence": "red \\ud800", "label": "warm"}', "invalid Unicode"),
    ('{"sentence": "x", "label": "warm", "n": ' + "9" * 5000 + "}", "malformed JSON"),
])
def test_malformed_jsonl_rows_are_one_line(tmp_path, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task": "bad", "labels": ["warm", "cool"]}\n' + line + "\n")
    with pytest.raises(SureclError, match=words) as err:
        load_jsonl_task(path)
    assert "\n" not in str(err.value)


def test_a_run_leaves_the_callers_tasks_as_given():
    """data.invalid_labels=drop drops the rows of the run's copies, not of the caller's objects."""
    train = [Example(f"t {i}", ["warm", "cool"][i % 2]) for i in range(6)] + [Example("odd", "hot")]
    test = [Example(f"e {i}", ["warm", "cool"][i % 2]) for i in range(4)]
    mine = Task("mine", "Which? ", ["warm", "cool"], list(train), list(test))
    [used] = caller_stream([mine], build_config("tiny", ["data.invalid_labels=drop"]))
    assert len(used.train) == 6 and all(ex.label != "hot" for ex in used.train)
    assert mine.train == train and mine.test == test and "dropped" not in mine.meta


def test_rows_longer_than_the_models_positions_are_refused():
    """model.max_length bounds the prompt; with the answer after it a row can pass the model's
    positions (GPT-2's 1,024 stop in an index error mid-run): refused before training."""
    from types import SimpleNamespace

    from surecl.data.encode import Encoded
    from surecl.run_setup import check_context
    from surecl.run_state import InputSets

    def run_of(prompt_len: int, seq2seq: bool = False):
        rows = [Encoded(list(range(prompt_len)), [7, 8, 1], "x")]
        return SimpleNamespace(is_seq2seq=seq2seq, tasks=[SimpleNamespace(name="long", kind="classify")], cfg=build_config("tiny", ["model.max_length=1024"]),
                               train_sets=InputSets([rows], lambda t: ()), test_sets=InputSets([rows], lambda t: ()),
                               label_answers=[{"x": [7, 8, 1]}], general=None, general_sets=[])

    with pytest.raises(SureclError, match=r"task long: rows of up to 1028 tokens .* the model's 1024 positions; lower "
                                          r"model.max_length \(now 1024\) by at least 4"):
        check_context(run_of(1024), SimpleNamespace(n_positions=1024))
    check_context(run_of(1020), SimpleNamespace(n_positions=1024))  # 1020 + 3 + 1 fits
    check_context(run_of(1024), SimpleNamespace(max_position_embeddings=4096))
    check_context(run_of(1024, seq2seq=True), SimpleNamespace(n_positions=512))  # T5's positions are relative


def test_what_evaluation_generates_and_the_probes_rows_must_fit_the_models_positions():
    """A row of a generation task with a long prompt and a short answer still gets the task's
    whole generation budget (its longest answer + 1); a general probe's rows are read too. Both
    are checked before training (a model with learned positions stopped mid-run with an index
    error, a rotary one generated past its trained length)."""
    from types import SimpleNamespace

    from surecl.data.encode import Encoded
    from surecl.run_setup import check_context
    from surecl.run_state import InputSets

    positions = SimpleNamespace(n_positions=64)
    gen = SimpleNamespace(name="qa", kind="generate")
    long_prompt, long_answer = Encoded(list(range(50)), [5, 1], "warm"), Encoded(list(range(4)), list(range(40)), "a long answer")

    def run_of(rows, general=None, general_rows=(), overrides=()):
        return SimpleNamespace(is_seq2seq=False, tasks=[gen], cfg=build_config("tiny", ["model.max_length=62", *overrides]),
                               train_sets=InputSets([[long_answer]], lambda t: ()), test_sets=InputSets([rows], lambda t: ()),
                               label_answers=[{}], general=general, general_sets=[list(general_rows)] if general else [])

    check_context(run_of([long_answer]), positions)  # 4 + 40 + 1
    with pytest.raises(SureclError, match=r"task qa: rows of up to 91 tokens .* the 41 tokens evaluation generates\) do not fit the model's "
                                          r"64 positions; lower model.max_length \(now 62\) by at least 27 or eval.max_new_tokens"):
        check_context(run_of([long_prompt, long_answer]), positions)  # 50 + 41
    check_context(run_of([long_prompt, long_answer], overrides=["eval.max_new_tokens=8"]), positions)  # 50 + max(2 + 1, 8)
    text = SimpleNamespace(name="text", kind="text", group="general")
    probe = SimpleNamespace(tasks=[text])
    check_context(run_of([long_answer], probe, [Encoded([], list(range(60)), "")]), positions)  # 60 + 1
    with pytest.raises(SureclError, match=r"the general-ability probe's text part: rows of up to 71 tokens"):
        check_context(run_of([long_answer], probe, [Encoded([], list(range(70)), "")]), positions)


def test_a_text_task_passed_into_a_classification_stream_is_refused():
    """Perplexity (lower is better) among accuracies would invert forgetting and BWT and average
    unlike numbers into one FP."""
    text = Task("docs", "", [], [Example("some text", "")], [Example("more text", "")], kind="text")
    labelled = Task("mine", "Which? ", ["warm", "cool"], [Example("t", "warm")], [Example("e", "cool")])
    with pytest.raises(SureclError, match=r"tasks: docs is a text task \(scored by perplexity\) in a data.kind=classify stream"):
        caller_stream([labelled, text], build_config("tiny"))
    assert [t.kind for t in caller_stream([labelled, text], build_config("tiny,cpt"))] == ["text", "text"]


def test_an_own_test_draw_keeps_the_test_rows_whatever_n_train():
    """data.test_draw=own: a data-size ablation tests every n_train on the same rows; the
    default (after_train, as every earlier run drew) tests them on other rows."""
    def tests(n_train: int, how: str) -> dict[str, list[str]]:
        cfg = build_config("tiny", [f"data.n_train={n_train}", "data.n_test=8", f"data.test_draw={how}"])
        return {t.name: [ex.sentence for ex in t.test] for t in load_stream(cfg)}

    assert tests(8, "own") == tests(24, "own")
    assert tests(8, "after_train") != tests(24, "after_train")
    assert tests(8, "after_train") == tests(8, "after_train")  # still a fixed draw per seed
    with pytest.raises(SureclError, match=r"data.test_draw"):
        build_config("tiny", ["data.test_draw=fresh"])


# --------------------------------------------------------------------------- labels, instructions, hold-outs


def test_labels_are_one_class_however_their_unicode_is_composed(tmp_path):
    """"café" with a combining accent (NFD) and precomposed (NFC) is one label, in rows and header alike."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    path = tmp_path / "t.jsonl"
    rows = [{"sentence": "a", "label": nfc}, {"sentence": "b", "label": nfd}, {"sentence": "c", "label": "x"},
            {"sentence": "d", "label": nfd, "split": "test"}, {"sentence": "e", "label": "x", "split": "test"}]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    task = load_jsonl_task(path)
    assert task.labels == [nfc, "x"] and {ex.label for ex in task.train + task.test} == {nfc, "x"}
    path.write_text(json.dumps({"task": "t", "labels": [nfd, "x"]}, ensure_ascii=False) + "\n"
                    + "\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    assert load_jsonl_task(path).labels == [nfc, "x"]


@pytest.mark.parametrize("label", ["", "   "])
def test_a_blank_classification_label_is_one_line(tmp_path, label):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"sentence": "a", "label": "x"}, {"sentence": "b", "label": label},
                                                       {"sentence": "c", "label": "x", "split": "test"}]) + "\n")
    with pytest.raises(SureclError, match="train row 1: empty label") as err:
        load_jsonl_task(path)
    assert "\n" not in str(err.value)
    csv_path = write_csv(tmp_path / "t.csv", [("a", "pos"), ("b", "neg"), ("c", label or " "), ("d", "pos"), ("e", "neg")])
    with pytest.raises(SureclError, match="empty label"):
        load_hf_task(HFTaskConfig(path=str(csv_path), test_fraction=0.4), "data.hf[0]")


@pytest.mark.parametrize("given, used", [("Is it blue?", "Is it blue?\n"), ("Is it blue?\n", "Is it blue?\n"), ("Say: ", "Say: "), ("", "")])
def test_an_instruction_without_a_newline_does_not_run_into_the_input(tmp_path, given, used):
    """A header instruction is put before every input: one that ends in a word gets a newline."""
    rows = json.dumps({"sentence": "dog", "label": "blue"}) + "\n" + json.dumps({"sentence": "cat", "label": "cat", "split": "test"}) + "\n"
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"task": "t", "instruction": given, "labels": ["blue", "cat"]}) + "\n" + rows)
    assert load_jsonl_task(path).instruction == used
    gen = tmp_path / "g.jsonl"
    gen.write_text(json.dumps({"task": "g", "kind": "generate", "instruction": given}) + "\n"
                   + json.dumps({"prompt": "dog", "response": "blue"}) + "\n" + json.dumps({"prompt": "cat", "response": "cat", "split": "test"}) + "\n")
    assert load_jsonl_task(gen).instruction == used


def test_a_header_without_a_task_name_is_read_as_the_header(tmp_path):
    path = tmp_path / "moods.jsonl"
    path.write_text(json.dumps({"labels": ["blue", "cat"]}) + "\n" + json.dumps({"sentence": "a", "label": "blue"}) + "\n"
                    + json.dumps({"sentence": "b", "label": "cat", "split": "test"}) + "\n")
    task = load_jsonl_task(path)
    assert (task.name, task.labels, len(task.train)) == ("moods", ["blue", "cat"], 1)


def test_a_held_out_test_split_never_shares_a_text_with_train(tmp_path):
    """test_fraction holds out whole groups of identical rows where texts repeat (20 texts, 10 copies each)."""
    rows = [(f"text{i % 20}", "pos" if i % 2 else "neg") for i in range(200)]
    task = load_hf_task(HFTaskConfig(path=str(write_csv(tmp_path / "dups.csv", rows)), test_fraction=0.2), "data.hf[0]")
    train, test = {ex.sentence for ex in task.train}, {ex.sentence for ex in task.test}
    assert not train & test and len(task.test) >= 40 and len(task.train) + len(task.test) == 200
    unique = [(f"t{i}", "pos" if i % 2 else "neg") for i in range(50)]  # no copies: the plain draw, as before
    plain = load_hf_task(HFTaskConfig(path=str(write_csv(tmp_path / "u.csv", unique)), test_fraction=0.2), "data.hf[0]")
    assert len(plain.test) == 10


def test_a_bad_jsonl_row_is_named_by_its_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"task": "t"}\n\n{"sentence": "a", "label": "x"}\n{"sentence": "b", "label": "y", "split": "test"}\n{"label": "x"}\n')
    with pytest.raises(SureclError, match=r"t\.jsonl line 5: missing 'sentence'"):
        load_jsonl_task(path)


def test_an_empty_generation_prompt_from_a_dataset_is_one_line(tmp_path):
    rows = [{"text": t, "label": a} for t, a in [("  ", "an answer"), ("q", "another"), ("r", "third"), ("s", "fourth")]]
    (tmp_path / "g.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SureclError, match="row 0: empty prompt") as err:
        load_hf_task(HFTaskConfig(path=str(tmp_path / "g.jsonl"), test_fraction=0.25), "data.hf[0]", kind="generate")
    assert "\n" not in str(err.value)


def test_an_empty_field_in_an_integer_label_column_names_its_row(tmp_path):
    """A CSV column of integer labels with one empty field reads as floats: the error names the
    row without a label, not the column's type."""
    path = write_csv(tmp_path / "ints.csv", [("a", 1), ("b", 2), ("c", ""), ("d", 1), ("e", 2)])
    with pytest.raises(SureclError, match=r"train row 2: no label \(an empty field\)") as err:
        load_hf_task(HFTaskConfig(path=str(path), test_fraction=0.4), "data.hf[0]")
    assert "\n" not in str(err.value)


def test_task_names_of_any_script_are_names_and_a_file_name_that_is_none_says_how(tmp_path):
    """A task name was ASCII only, though it reaches no file name: avis_été and 情感 were refused
    with a message saying letters are allowed. A JSONL file named with a space says to give a
    header or rename the file."""
    rows = [Example(f"t {i}", "ab"[i % 2]) for i in range(4)]
    for name in ("avis_été", "情感", "Ωmega-2", "हिंदी", "தமிழ்", "avis_e\u0301te\u0301"):  # marks of Indic scripts; NFD
        Task(name, "", ["a", "b"], rows, rows).check()
    for name in ("a b", "../x", "_x", "a/b", "", "abc\n", "a\tb", "\u0301a"):
        with pytest.raises(SureclError, match="must be letters, digits"):
            Task(name, "", ["a", "b"], rows, rows).check()
    body = "".join(json.dumps({"sentence": f"s{i}", "label": "ab"[i % 2], "split": ["train", "test"][i % 2 == 0 and i > 1]}) + "\n" for i in range(8))
    (tmp_path / "avis_été.jsonl").write_text(body)
    assert load_jsonl_task(tmp_path / "avis_été.jsonl").name == "avis_été"
    (tmp_path / "my reviews.jsonl").write_text(body)
    with pytest.raises(SureclError, match=r"named after the file, 'my reviews'.*first line \{\"task\": \"name\"\} or rename") as err:
        load_jsonl_task(tmp_path / "my reviews.jsonl")
    assert "\n" not in str(err.value)
    (tmp_path / "h.jsonl").write_text(json.dumps({"task": "mine"}) + "\n" + body)
    assert load_jsonl_task(tmp_path / "h.jsonl").name == "mine"


def test_a_task_name_typed_decomposed_is_the_same_task_everywhere():
    """"été" typed as e + combining accent (NFD, as macOS gives file names) and composed (NFC)
    is one name: a Task passed from Python, data.tasks and per-task values all read it composed,
    so a per-task value typed the other way applies to its task."""
    from surecl.plan import check_task_names, task_epochs

    nfd, nfc = "avis_e\u0301te\u0301", "avis_été"
    rows = [Example(f"t {i}", "ab"[i % 2]) for i in range(4)]
    assert Task(nfd, "", ["a", "b"], rows, rows).name == nfc
    cfg = build_config("tiny", [f"train.epochs_per_task=[{nfd}:3]", f"data.tasks=[colors,{nfd}]"])
    assert cfg.data.tasks == ["colors", nfc]
    assert task_epochs(cfg, [nfc]) == [3] and check_task_names(cfg, ["colors", nfc]) == []
    cfg = build_config("tiny", [f"train.epochs_per_task=[{nfc}:3]"])
    assert task_epochs(cfg, [Task(nfd, "", ["a", "b"], rows, rows).name]) == [3]


def test_in_memory_hub_subsets_are_named_with_their_config():
    """glue/sst2 and glue/cola passed from Python were both "glue" (super_glue's boolq and cb:
    "named twice"); they are named as data.hf names them, glue-sst2."""
    from datasets import Dataset, DatasetDict, DatasetInfo

    def subset(builder, config):
        part = Dataset.from_dict({"text": [f"{config} {i}" for i in range(4)], "label": ["a", "b"] * 2},
                                 info=DatasetInfo(dataset_name=builder, config_name=config))
        return DatasetDict(train=part, test=part)

    tasks = caller_tasks([subset("glue", "sst2"), subset("glue", "cola"), subset("mine", "default")], build_config("tiny"))
    assert [t.name for t in tasks] == ["glue-sst2", "glue-cola", "mine"]


def test_a_saved_config_reads_back_equal_whatever_its_text_holds(tmp_path):
    """YAML reads a raw U+0085 (what cp1252's ellipsis becomes read as latin-1) as a line break:
    an instruction holding one came back with a space, so config.yaml ran another instruction."""
    for text in ("\x85z", "a\u2028b", "c\u2029d", "plain é"):
        cfg = build_config("tiny", [f"data.hf=[{{path: x.csv, test_fraction: 0.2, instruction: {json.dumps(text)}}}]"])
        assert cfg.data.hf[0].instruction == text
        saved = tmp_path / "c.yaml"
        saved.write_text(cfg.to_yaml())
        assert build_config(str(saved)).to_dict() == cfg.to_dict()
    assert "plain é" in cfg.to_yaml()  # readable text stays readable
