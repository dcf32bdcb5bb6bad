"""Tasks from Hugging Face ``datasets`` sources (``data.hf``): every source gives the task the
equivalent JSONL file gives, the column / split / label options work, every bad source is a
one-line error with exit code 2 that writes nothing, and a tiny run learns from two such tasks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest
from datasets import ClassLabel, Dataset, DatasetDict

from surecl.cli import main
from surecl.config import DataConfig, HFTaskConfig, RunConfig, build_config
from surecl.data.hf import load_hf_task
from surecl.data.jsonl import GENERIC_INSTRUCTION, load_jsonl_task
from surecl.data.task import Task
from surecl.data.tiny import tiny_stream
from surecl.errors import SureclError
from surecl.trainer import run

TINY = {t.name: t for t in tiny_stream(n_train=48, n_test=16)}


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """``load_dataset`` caches what it reads: into the test's folder, never the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))
    # save_to_disk / to_parquet print progress bars; they are the test's, not surecl's.
    datasets.disable_progress_bars()


def columns(rows, text="text", label="label") -> dict[str, list]:
    return {text: [ex.sentence for ex in rows], label: [ex.label for ex in rows]}


def write_jsonl(path: Path, task) -> Path:
    lines = [{"sentence": ex.sentence, "label": ex.label, "split": split} for split in ("train", "test") for ex in getattr(task, split)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def same_task(a, b) -> bool:
    """Equal in everything the engine reads (the group says where a task came from)."""
    return (a.name, a.instruction, a.labels, a.train, a.test, a.kind) == (b.name, b.instruction, b.labels, b.train, b.test, b.kind)


def two_split_source(kind: str, root: Path, task) -> Path:
    """``task``'s two splits as a ``kind`` source named after the task."""
    train, test = Dataset.from_dict(columns(task.train)), Dataset.from_dict(columns(task.test))
    path = root / task.name
    if kind == "saved DatasetDict":
        DatasetDict(train=train, test=test).save_to_disk(str(path))
        return path
    path.mkdir(parents=True)
    for split, ds in (("train", train), ("test", test)):
        if kind == "parquet files":
            ds.to_parquet(str(path / f"{split}.parquet"))
        elif kind == "csv files":
            ds.to_csv(str(path / f"{split}.csv"), index=False)
        elif kind == "jsonl files":
            ds.to_json(str(path / f"{split}.jsonl"))
        else:
            raise AssertionError(kind)
    return path


def one_split_source(kind: str, root: Path, rows, name: str = "data", **cols) -> Path:
    ds = Dataset.from_dict(columns(rows, **cols))
    if kind == "saved Dataset":
        path = root / name
        ds.save_to_disk(str(path))
    elif kind == "parquet":
        path = root / f"{name}.parquet"
        ds.to_parquet(str(path))
    elif kind == "csv":
        path = root / f"{name}.csv"
        ds.to_csv(str(path), index=False)
    elif kind == "json":  # one JSON array
        path = root / f"{name}.json"
        path.write_text(json.dumps([dict(zip(ds.column_names, r)) for r in zip(*(ds[c] for c in ds.column_names))]))
    elif kind == "jsonl":
        path = root / f"{name}.jsonl"
        ds.to_json(str(path))
    else:
        raise AssertionError(kind)
    return path


# ------------------------------------------------------------------ sources


@pytest.mark.parametrize("kind", ["saved DatasetDict", "parquet files", "csv files", "jsonl files"])
def test_two_split_source_is_the_jsonl_task(kind, tmp_path):
    task = TINY["colors"]
    expected = load_jsonl_task(write_jsonl(tmp_path / "colors.jsonl", task))
    got = load_hf_task(HFTaskConfig(path=str(two_split_source(kind, tmp_path / "src", task))))
    assert same_task(got, expected)
    assert (got.name, got.labels, got.instruction, got.group) == ("colors", ["cool", "warm"], GENERIC_INSTRUCTION, "hf")
    assert len(got.train) == 48 and len(got.test) == 16


@pytest.mark.parametrize("kind", ["saved Dataset", "parquet", "csv", "json", "jsonl"])
def test_one_split_source_with_a_held_out_fraction(kind, tmp_path):
    rows = TINY["animals"].train
    assert len(set(rows)) == len(rows) == 48  # distinct rows: membership below identifies each
    path = one_split_source(kind, tmp_path, rows)
    got = load_hf_task(HFTaskConfig(path=str(path), task="animals", test_fraction=0.25))
    assert got.name == "animals" and got.labels == ["pet", "wild"]
    assert len(got.test) == 12 and len(got.train) == 36
    # a partition of the rows, each part in file order
    held = [i for i, ex in enumerate(rows) if ex in got.test]
    assert got.train + got.test != rows and sorted(got.train + got.test, key=rows.index) == rows
    assert got.test == [rows[i] for i in held] and got.train == [ex for ex in rows if ex not in got.test]
    # the same draw for the same task name, whatever the source format; another name draws another
    again = load_hf_task(HFTaskConfig(path=str(one_split_source("parquet", tmp_path / "p", rows)), task="animals", test_fraction=0.25))
    assert same_task(again, got)
    other = load_hf_task(HFTaskConfig(path=str(path), task="animals2", test_fraction=0.25))
    assert other.test != got.test and len(other.test) == 12
    # equal to the JSONL file holding the same split
    write_jsonl(tmp_path / "animals.jsonl", Task("animals", "", [], got.train, got.test))
    assert same_task(load_jsonl_task(tmp_path / "animals.jsonl"), got)


def test_default_task_names(tmp_path):
    rows = TINY["colors"].train
    assert (
        load_hf_task(HFTaskConfig(path=str(one_split_source("csv", tmp_path, rows, name="my_reviews")), test_fraction=0.5)).name
        == "my_reviews"
    )
    assert (
        load_hf_task(HFTaskConfig(path=str(one_split_source("saved Dataset", tmp_path, rows, name="topics")), test_fraction=0.5)).name
        == "topics"
    )


def test_columns_splits_instruction_and_given_labels(tmp_path):
    task = TINY["numbers"]
    ds = DatasetDict(
        fit=Dataset.from_dict(columns(task.train, text="review", label="stars")),
        holdout=Dataset.from_dict(columns(task.test, text="review", label="stars")),
    )
    ds.save_to_disk(str(tmp_path / "numbers"))
    spec = HFTaskConfig(
        path=str(tmp_path / "numbers"),
        text_column="review",
        label_column="stars",
        train_split="fit",
        test_split="holdout",
        labels=["odd", "even"],
        instruction="Odd or even? ",
    )
    got = load_hf_task(spec)
    assert got.labels == ["odd", "even"] and got.instruction == "Odd or even? "
    assert got.train == task.train and got.test == task.test


def test_class_label_names_and_integer_labels(tmp_path):
    task = TINY["weather"]
    names = ["wet", "dry"]  # not sorted: the column's order is the task's

    def encoded(rows):
        return Dataset.from_dict({"text": [ex.sentence for ex in rows], "label": [names.index(ex.label) for ex in rows]})

    with_names = DatasetDict(train=encoded(task.train), test=encoded(task.test)).cast_column("label", ClassLabel(names=names))
    with_names.save_to_disk(str(tmp_path / "weather"))
    got = load_hf_task(HFTaskConfig(path=str(tmp_path / "weather")))
    assert got.labels == names and got.train == task.train and got.test == task.test
    # Parquet keeps the ClassLabel feature
    with_names["train"].to_parquet(str(tmp_path / "weather.parquet"))
    got = load_hf_task(HFTaskConfig(path=str(tmp_path / "weather.parquet"), test_fraction=0.25))
    assert got.labels == names and sorted(got.train + got.test, key=task.train.index) == task.train
    # CSV does not: integers are the labels' indices where labels are given, else their numbers
    encoded(task.train).to_csv(str(tmp_path / "w.csv"), index=False)
    by_index = load_hf_task(HFTaskConfig(path=str(tmp_path / "w.csv"), task="weather", labels=names, test_fraction=0.25))
    assert by_index.labels == names and sorted(by_index.train + by_index.test, key=task.train.index) == task.train
    numbers = load_hf_task(HFTaskConfig(path=str(tmp_path / "w.csv"), test_fraction=0.25))
    assert numbers.labels == ["0", "1"] and {ex.label for ex in numbers.train} == {"0", "1"}


def test_unlabelled_rows_are_dropped_on_request(tmp_path):
    """Hub datasets mark test rows without a gold label with -1 (GLUE): an error naming the
    row, or dropped and counted with data.invalid_labels=drop."""
    task = TINY["colors"]
    names = ["cool", "warm"]
    test_ids = [names.index(ex.label) for ex in task.test]
    test_ids[3] = -1
    dd = DatasetDict(
        train=Dataset.from_dict({"text": [ex.sentence for ex in task.train], "label": [names.index(ex.label) for ex in task.train]}),
        test=Dataset.from_dict({"text": [ex.sentence for ex in task.test], "label": test_ids}),
    ).cast_column("label", ClassLabel(names=names))
    dd.save_to_disk(str(tmp_path / "colors"))
    spec = HFTaskConfig(path=str(tmp_path / "colors"))
    with pytest.raises(SureclError, match=r"test row 3: label '-1' is not in its labels \['cool', 'warm'\]"):
        load_hf_task(spec)
    got = load_hf_task(spec, invalid_labels="drop")
    assert got.meta["dropped"] == {"test": 1} and got.test == task.test[:3] + task.test[4:]


def test_text_stream_reads_the_text_column_only(tmp_path):
    task = TINY["animals"]
    DatasetDict(
        train=Dataset.from_dict({"text": [e.sentence for e in task.train]}),
        test=Dataset.from_dict({"text": [e.sentence for e in task.test]}),
    ).save_to_disk(str(tmp_path / "docs"))
    got = load_hf_task(HFTaskConfig(path=str(tmp_path / "docs")), kind="text")
    assert got.kind == "text" and got.labels == [] and [e.sentence for e in got.train] == [e.sentence for e in task.train]


def test_config_entries_round_trip(tmp_path):
    cfg = build_config(
        "tiny,seq_lora", ["data.benchmark=none", "data.hf=[a.parquet, {path: b, text_column: review, labels: [x, y], test_fraction: 0.2}]"]
    )
    assert cfg.data.hf == [
        HFTaskConfig(path="a.parquet"),
        HFTaskConfig(path="b", text_column="review", labels=["x", "y"], test_fraction=0.2),
    ]
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())
    assert build_config(str(tmp_path / "config.yaml")).to_dict() == cfg.to_dict()
    assert build_config("tiny,seq_lora", ["data.hf=a.csv,b.csv"]).data.hf == [HFTaskConfig(path="a.csv"), HFTaskConfig(path="b.csv")]
    assert RunConfig(data=DataConfig(hf=["z.csv"])).data.hf == [HFTaskConfig(path="z.csv")]
    with pytest.raises(SureclError, match=r"unknown config key 'data.hf\[1\].colum'"):
        build_config("tiny,seq_lora", ["data.hf=[a.csv, {path: b.csv, colum: x}]"])


# ------------------------------------------------------------------ bad sources: one line, exit 2, nothing written


def good_dict(root: Path) -> Path:
    return two_split_source("saved DatasetDict", root, TINY["colors"])


def _float_labels(root: Path) -> Path:
    Dataset.from_dict({"text": ["a", "b"], "label": [0.5, 1.5]}).to_parquet(str(root / "f.parquet"))
    return root / "f.parquet"


def _bool_labels(root: Path) -> Path:
    Dataset.from_dict({"text": ["a", "b"], "label": [True, False]}).to_parquet(str(root / "b.parquet"))
    return root / "b.parquet"


def _null_label(root: Path) -> Path:
    Dataset.from_dict({"text": ["a", "b", "c"], "label": ["x", None, "y"]}).to_parquet(str(root / "n.parquet"))
    return root / "n.parquet"


def _empty_test(root: Path) -> Path:
    (root / "colors").mkdir()
    Dataset.from_dict(columns(TINY["colors"].train)).to_csv(str(root / "colors" / "train.csv"), index=False)
    (root / "colors" / "test.csv").write_text("text,label\n")
    return root / "colors"


def _empty_parquet(root: Path) -> Path:
    features = datasets.Features(text=datasets.Value("string"), label=datasets.Value("string"))
    Dataset.from_dict({"text": [], "label": []}, features=features).to_parquet(str(root / "e.parquet"))
    return root / "e.parquet"


def _garbage(name: str, content: bytes):
    def make(root: Path) -> Path:
        (root / name).write_bytes(content)
        return root / name

    return make


def _fifo(root: Path) -> Path:
    os.mkfifo(root / "pipe.csv")
    return root / "pipe.csv"


def _empty_folder(root: Path) -> Path:
    (root / "empty").mkdir()
    return root / "empty"


def _bad_name(root: Path) -> Path:
    Dataset.from_dict(columns(TINY["colors"].train)).to_csv(str(root / "my reviews.csv"), index=False)
    return root / "my reviews.csv"


def _non_text(root: Path) -> Path:
    Dataset.from_dict({"text": [1, 2], "label": ["a", "b"]}).to_parquet(str(root / "t.parquet"))
    return root / "t.parquet"


BAD = {
    # name: (make(root) -> path, or a literal path; extra entry fields; words expected in the message)
    "missing text column": (
        good_dict,
        {"text_column": "review"},
        ["data.hf[0].text_column", "no column 'review'", "its columns: text, label"],
    ),
    "missing label column": (good_dict, {"label_column": "stars"}, ["data.hf[0].label_column", "no column 'stars'"]),
    "missing train split": (good_dict, {"train_split": "fit"}, ["data.hf[0].train_split", "no split 'fit'", "its splits: train, test"]),
    "missing test split": (
        lambda r: one_split_source("parquet", r, TINY["colors"].train),
        {},
        ["data.hf[0].test_split", "no split 'test'", "test_fraction"],
    ),
    "empty test split": (_empty_test, {}, ["data.hf[0].path", "colors has an empty test split"]),
    "empty file": (_empty_parquet, {"test_fraction": 0.5}, ["data.hf[0].path", "e.parquet has an empty train split"]),
    "every row dropped": (good_dict, {"labels": ["hot"], "_drop": True}, ["data.hf[0]", "task colors has an empty train split"]),
    "held-out fraction too small": (
        lambda r: one_split_source("csv", r, TINY["colors"].train),
        {"test_fraction": 0.001},
        ["data.hf[0].test_fraction", "no test rows"],
    ),
    "fraction out of range": (good_dict, {"test_fraction": 1.0}, ["data.hf[0].test_fraction", "[0, 1)"]),
    "float labels": (_float_labels, {"test_fraction": 0.5}, ["data.hf[0].label_column", "float64 values", "strings or integers"]),
    "bool labels": (_bool_labels, {"test_fraction": 0.5}, ["data.hf[0].label_column", "bool values", "strings or integers"]),
    "null label": (_null_label, {"test_fraction": 0.3}, ["data.hf[0].label_column", "train row 1", "no label"]),
    "numbers as text": (_non_text, {"test_fraction": 0.5}, ["data.hf[0].text_column", "int64 values", "not text"]),
    "label outside the given labels": (good_dict, {"labels": ["warm"]}, ["data.hf[0]", "'cool' is not in its labels"]),
    "missing file": ("/nonexistent/reviews.parquet", {}, ["data.hf[0].path", "/nonexistent/reviews.parquet", "does not exist"]),
    "missing folder": ("./no/such/folder", {}, ["data.hf[0].path", "no/such/folder", "does not exist"]),
    "corrupt parquet": (_garbage("x.parquet", b"PAR1 this is not parquet"), {}, ["data.hf[0].path", "cannot read", "as PARQUET"]),
    "malformed json": (_garbage("x.json", b'[{"text": "a", '), {}, ["data.hf[0].path", "cannot read", "as JSON"]),
    "unknown suffix": (_garbage("x.txt", b"hello"), {}, ["data.hf[0].path", "not a data file"]),
    "folder without data": (_empty_folder, {}, ["data.hf[0].path", "cannot read", "folder of data files"]),
    "fifo": (_fifo, {}, ["data.hf[0].path", "not a regular file"]),
    "task name from path": (_bad_name, {"test_fraction": 0.5}, ["data.hf[0].task", "'my reviews'"]),
    "hub id offline": ("surecl-tests/no-such-dataset", {}, ["data.hf[0].path", "'surecl-tests/no-such-dataset'", "Hugging Face hub"]),
}


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_source_is_one_line_exit_2_and_writes_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    make, extra, words = BAD[case]
    extra = dict(extra)
    root = tmp_path / "data"
    root.mkdir()
    path = make if isinstance(make, str) else str(make(root))
    drop = ["data.invalid_labels=drop"] if extra.pop("_drop", False) else []
    entry = json.dumps({"path": path, **extra})
    out = tmp_path / "out"
    out.mkdir()
    from surecl.checkpoint import Manifest

    Manifest(out).claim("report.md")  # an earlier run's output, listed in its manifest
    (out / "report.md").write_text("an earlier report")
    before = tree_digest(out)
    t0 = time.monotonic()
    code = main(["run", "--config", "tiny,seq_lora", "--out", str(out), "--quiet", "data.benchmark=none", f"data.hf=[{entry}]", *drop])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("surecl: error: ")
    for w in words:
        assert w in err[0], (w, err[0])
    assert tree_digest(out) == before
    assert time.monotonic() - t0 < 30


def _cli(*overrides: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    """``surecl run --dry-run`` (reads the data, loads no model) in a subprocess: the real
    console, where a library's log line or progress bar would show beside the error."""
    cmd = [sys.executable, "-m", "surecl.cli", "run", "--config", "tiny,seq_lora", "--dry-run", "data.benchmark=none", *overrides]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    return done, time.monotonic() - t0


def test_hub_id_without_offline_mode_fails_fast_in_one_line(tmp_path):
    """Without HF_HUB_OFFLINE, a hub id is looked up with a short timeout: no hub here means
    one line within seconds, not minutes of retries and a traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    # the hub at a closed local port: unreachable at once on every machine (no DNS lookup to wait for)
    env.update(HF_HOME=str(tmp_path / "hf"), SURECL_CACHE=str(tmp_path / "cache"), HF_ENDPOINT="http://127.0.0.1:9")
    done, took = _cli("data.hf=[surecl-tests/no-such-dataset]", env=env)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0].startswith("surecl: error: data.hf[0].path: 'surecl-tests/no-such-dataset' is not a local file or folder"), err
    assert "Hugging Face hub" in err[0]
    assert took < 60


def test_unreadable_file_is_one_line_on_the_console(tmp_path):
    """datasets logs a Parquet reader's failure before raising it: the console shows only surecl's line."""
    (tmp_path / "x.parquet").write_bytes(b"PAR1 this is not parquet")
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), SURECL_CACHE=str(tmp_path / "cache"))
    done, _ = _cli(f"data.hf=[{tmp_path / 'x.parquet'}]", env=env)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"surecl: error: data.hf[0].path: cannot read {tmp_path / 'x.parquet'} as PARQUET (ArrowInvalid: Parquet magic bytes not found in footer. "
        "Either the file is corrupted or this is not a parquet file.)"
    ], done.stderr


def test_dry_run_lists_hf_tasks(tmp_path):
    colors = two_split_source("parquet files", tmp_path, TINY["colors"])
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), SURECL_CACHE=str(tmp_path / "cache"))
    done, _ = _cli(f"data.hf=[{colors}]", env=env)
    assert done.returncode == 0, done.stderr
    assert "| 1 | colors | 48 | 16 |" in done.stdout
    assert "Generating" not in done.stderr  # no datasets progress bars


def test_missing_datasets_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError
    with pytest.raises(SureclError, match=r"^data.hf\[0\]: .*pip install 'surecl\[hf\]'$"):
        load_hf_task(HFTaskConfig(path=str(tmp_path / "x.parquet")))


def test_datasets_is_imported_only_for_hf_tasks():
    code = "import sys; from surecl.config import build_config; from surecl.data.loading import load_stream; load_stream(build_config('tiny,seq_lora')); print('datasets' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# ------------------------------------------------------------------ end to end


def test_tiny_run_learns_from_two_hf_tasks_as_from_jsonl(tmp_path, tiny_cache):
    """A Parquet folder and a saved DatasetDict as the stream: the first task is learned, and the
    run is the run of the same two tasks as JSONL files, result for result."""
    colors = two_split_source("parquet files", tmp_path / "hf", TINY["colors"])
    animals = two_split_source("saved DatasetDict", tmp_path / "hf", TINY["animals"])
    common = ["data.benchmark=none", "train.epochs=8"]
    hf = build_config("tiny,seq_lora", common + [f"data.hf=[{colors}, {animals}]"])
    res = run(hf, tmp_path / "run-hf", progress=False, cache_dir=tiny_cache)
    assert res["tasks"] == ["colors", "animals"]
    assert res["accuracy_matrix"][0][0] >= 80.0, res["accuracy_matrix"]
    jsonl = [write_jsonl(tmp_path / f"{t}.jsonl", TINY[t]) for t in ("colors", "animals")]
    ref = run(
        build_config("tiny,seq_lora", common + [f"data.jsonl=[{jsonl[0]},{jsonl[1]}]"]),
        tmp_path / "run-jsonl",
        progress=False,
        cache_dir=tiny_cache,
    )
    assert res["accuracy_matrix"] == ref["accuracy_matrix"]
    logs = [(tmp_path / r / "log.jsonl").read_text() for r in ("run-hf", "run-jsonl")]
    assert logs[0] == logs[1]


def test_a_test_split_that_is_the_train_split_is_refused(tmp_path):
    """test_split = train_split would test the task on its own training examples: one line
    pointing to test_fraction (a held-out part of the one split)."""
    task = TINY["numbers"]
    DatasetDict(train=Dataset.from_dict(columns(task.train))).save_to_disk(str(tmp_path / "numbers"))
    with pytest.raises(SureclError, match="both 'train', so the task would be tested on its training examples.*test_fraction") as err:
        load_hf_task(HFTaskConfig(path=str(tmp_path / "numbers"), train_split="train", test_split="train"))
    assert "\n" not in str(err.value)
    held = load_hf_task(HFTaskConfig(path=str(tmp_path / "numbers"), train_split="train", test_fraction=0.25))
    assert not {e.sentence for e in held.train} & {e.sentence for e in held.test}
