"""A new user's first day: what trips someone who brings their own labels, model, tasks and
datasets, or takes an exported adapter elsewhere (issue 30, item 6)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

import surecl
from surecl.cli import main
from surecl.data.task import Example, Task
from surecl.errors import SureclError


def write_jsonl(path: Path, labels: list[str], name: str = "mine") -> Path:
    rows = [{"task": name, "instruction": "Which class fits the cue word in the text? ", "labels": labels}]
    rows += [{"sentence": f"the {['red', 'blue'][i % 2]}", "label": labels[i % 2], "split": "test" if i >= 8 else "train"} for i in range(12)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# ----------------------------------------------------------------------------- (a) labels


@pytest.mark.parametrize(
    "labels, words",
    [
        (["yes", "no"], ["task mine", "'yes', 'no'", "unknown or no tokens"]),  # not in the tiny vocabulary: all <unk>
        (["red x1", "red x2"], ["task mine", "'red x1' = 'red x2'", "same token ids"]),  # both "red <unk>"
        (["warm", "warm "], ["task mine lists a label twice"]),  # labels are stripped, as rows' labels are: one label
    ],
)
def test_labels_the_tokenizer_cannot_tell_apart_stop_in_one_line(labels, words, tmp_path, tiny_cache, monkeypatch, capsys):
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    path = write_jsonl(tmp_path / "mine.jsonl", labels)
    out = tmp_path / "run"
    code = main(["run", "--quiet", "--config", "tiny,seq_lora", "data.benchmark=none", f"data.jsonl=[{path}]", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]
    assert not (out / "checkpoints").exists() and not (out / "log.jsonl").exists()  # stopped before training


def test_labels_check_in_the_python_api(tmp_path, tiny_cache):
    rows = [Example("the red", "hot"), Example("the blue", "cold")] * 4
    task = Task("temps", "Which? ", ["hot", "cold"], rows, rows)
    cfg = surecl.build_config("tiny,seq_lora", [])
    with pytest.raises(SureclError, match=r"task temps: .*'hot', 'cold'.* unknown"):
        surecl.ContinualRun(cfg, tmp_path / "r", progress=False, cache_dir=tiny_cache, tasks=[task])


def test_labels_of_the_tiny_stream_pass_the_check(tiny_loaded):
    from surecl.data.encode import TaskEncoder
    from surecl.data.tiny import tiny_stream

    encoder = TaskEncoder(tiny_loaded.tokenizer, 64)
    assert all(encoder.check_labels(t) == [] for t in tiny_stream())


# ----------------------------------------------------------------------------- (b) provenance


@pytest.fixture(scope="module")
def python_run(tiny_loaded, tmp_path_factory):
    """A run given a model (loaded with plain transformers from a folder it was saved to) and
    tasks built in Python, as a user of the Python API would; dual, so both adapters export."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from surecl.data.tiny import tiny_stream

    root = tmp_path_factory.mktemp("python_run")
    base = root / "my-base"
    tiny_loaded.model.save_pretrained(base)
    tiny_loaded.tokenizer.save_pretrained(base)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(base), AutoTokenizer.from_pretrained(base)
    tasks = tiny_stream(n_train=24, n_test=8)[:2]
    cfg = surecl.build_config("tiny,slow_surprise", ["train.epochs=16", "data.n_train=0", "data.n_test=0"])
    results = surecl.run(cfg, root / "run", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    return base, root / "run", results, tasks


def test_python_run_records_the_real_model_and_data(python_run):
    base, out, results, tasks = python_run
    prov = json.loads((out / "results.json").read_text())["provenance"]
    assert prov["model"] == {"source": "python", "name_or_path": str(base), "class": "LlamaForCausalLM"}
    assert prov["data"]["source"] == "python" and prov["data"]["given"] == {t.name: t.fingerprint() for t in tasks}
    assert list(prov["data"]["fingerprints"]) == [t.name for t in tasks]  # the sampled rows', as checkpoints record
    assert "supplied in Python: config.yaml alone does not rerun it" in prov["note"]
    config = (out / "config.yaml").read_text()
    head = config.split("\nseed:")[0] if "\nseed:" in config else config[:2000]
    assert "supplied in Python: config.yaml alone does not rerun it" in head and str(base) in head
    assert "runs it again" not in config.splitlines()[0]
    assert all(t.fingerprint() in config for t in tasks)
    assert surecl.build_config(str(out / "config.yaml")) == surecl.build_config("tiny,slow_surprise", ["train.epochs=16", "data.n_train=0", "data.n_test=0"])
    for name in ("fast", "slow"):
        card = (out / "adapters" / name / "README.md").read_text()
        assert str(base) in card and "supplied in Python" in card and "tiny random Llama" not in card, card
        assert "`tiny` / " not in card  # not the benchmark the config names
        adapter = json.loads((out / "adapters" / name / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str(base)


def test_config_run_records_its_provenance_without_the_note(tmp_path, tiny_cache):
    cfg = surecl.build_config("tiny,seq_lora", ["data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.epochs=1"])
    # folders as text, as a script often passes them (a str cache_dir was a TypeError traceback)
    results = surecl.run(cfg, str(tmp_path / "run"), progress=False, cache_dir=str(tiny_cache))
    assert results["provenance"]["model"]["source"] == "config" and results["provenance"]["model"]["name_or_path"] == "tiny"
    assert "note" not in results["provenance"] and list(results["provenance"]["data"]["fingerprints"]) == ["colors"]
    assert "runs it again" in (tmp_path / "run" / "config.yaml").read_text().splitlines()[0]


# ----------------------------------------------------------------------------- (c) prompt.json, predictions.jsonl


def answer_with_plain_transformers(adapter_folder: Path, predictions: list[dict]) -> list[str]:
    """What a user's script does with an exported adapter and nothing of surecl: read its
    prompt.json, load the base it names and the adapter with transformers + peft, and ask it
    each row's input as prompt.json says (template, tokenisation, greedy decoding)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = json.loads((adapter_folder / "prompt.json").read_text())
    assert spec["decoding"]["mode"] == "generate" and spec["decoding"]["greedy"] and spec["model_type"] == "causal"
    tok = AutoTokenizer.from_pretrained(spec["base_model"])
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(spec["base_model"]), str(adapter_folder)).eval()
    tasks = {t["name"]: t for t in spec["tasks"]}
    t = spec["template"]

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    out = []
    for row in predictions:
        task = tasks[row["task"]]
        head, tail = list(t["start_ids"]) + ids(task["prompt_head"]), ids(task["prompt_tail"])
        body = ids(row["input"])[: max(t["max_length"] - len(head) - len(tail), 1)]
        prompt = torch.tensor([head + body + tail])
        with torch.no_grad():
            new = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=task["max_new_tokens"],
                                 do_sample=False, eos_token_id=t["eos_token_id"], pad_token_id=t["pad_token_id"])
        out.append(tok.decode(new[0, prompt.shape[1]:], skip_special_tokens=True))
    return out


def normalised(text: str, spec: dict) -> str:
    """prompt.json's normalisation, as written there."""
    text = text.strip().split("\n", 1)[0].lower()
    for ch in spec["normalisation"]["punctuation"]:
        text = text.replace(ch, " ")
    return " ".join(text.split())


def test_exported_adapter_reproduces_predictions_with_plain_transformers_and_peft(python_run):
    base, out, results, tasks = python_run
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    # every test row of every task (in the run's sampled order)
    assert sorted((r["task"], r["input"], r["gold"]) for r in rows) == sorted((t.name, ex.sentence, ex.label) for t in tasks for ex in t.test)
    # the final row of the matrix is the share of correct rows
    for j, t in enumerate(tasks):
        mine = [r for r in rows if r["task"] == t.name]
        assert 100.0 * sum(r["correct"] for r in mine) / len(mine) == pytest.approx(results["accuracy_matrix"][-1][j])
    manifest = json.loads((out / ".surecl-manifest.json").read_text())
    assert "predictions.jsonl" in manifest["final"] and "predictions.jsonl" in manifest["paths"]
    spec = json.loads((out / "adapters" / "slow" / "prompt.json").read_text())
    assert spec["predictions"]["answered_by"] == "slow" and spec["predictions"]["this_adapter_answered"]
    assert {t["name"]: t["labels"] for t in spec["tasks"]} == {t.name: t.labels for t in tasks}
    assert json.loads((out / "adapters" / "fast" / "prompt.json").read_text())["predictions"]["this_adapter_answered"] is False
    assert any(r["correct"] for r in rows) and not all(r["correct"] for r in rows)  # it learned the last task, forgot some
    got = answer_with_plain_transformers(out / "adapters" / "slow", rows)
    assert got == [r["prediction"] for r in rows]
    assert [normalised(g, spec) == normalised(r["gold"], spec) for g, r in zip(got, rows)] == [r["correct"] for r in rows]


# ----------------------------------------------------------------------------- (d) umask


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_outputs_follow_the_umask(mask, tmp_path, tiny_cache):
    """Atomic writes (temporary name, then rename) gave 0600 files and 0700 folders under any
    umask; every file and folder of a run now has the mode open() / mkdir() would give."""
    import os
    import stat

    cfg = surecl.build_config("tiny,slow_surprise", ["data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.epochs=1"])
    old = os.umask(mask)
    try:
        surecl.run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    finally:
        os.umask(old)
    seen = {"file": 0, "dir": 0}
    for path in [tmp_path / "run", *(tmp_path / "run").rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        kind = "dir" if path.is_dir() else "file"
        want = (0o777 if kind == "dir" else 0o666) & ~mask
        assert mode == want, f"{path.relative_to(tmp_path)}: {mode:o}, not {want:o}"
        seen[kind] += 1
    assert seen["file"] > 10 and seen["dir"] >= 4  # results, checkpoints, adapters, their folders


# ----------------------------------------------------------------------------- (e) trackers on resume


def test_tensorboard_gets_each_step_once_across_a_resume(tmp_path, tiny_cache, monkeypatch):
    """Killed after the first task's evaluation was logged but before its checkpoint: the rerun
    resumes from the mid-task checkpoint and trains (and evaluates) again what it had logged;
    TensorBoard gets every step and every matrix row once."""
    pytest.importorskip("tensorboardX")
    import tensorboardX.event_file_writer as event_file_writer
    from test_tracking import scalars

    from surecl import trainer

    # both runs start within one second (a fast machine): tensorboardX names its event file by
    # whole seconds and host, and the rerun's file must not truncate the killed run's
    monkeypatch.setattr(event_file_writer, "time", types.SimpleNamespace(time=lambda: 1700000000.25))
    cfg = surecl.build_config("tiny,slow_surprise", ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=4",
                                                     "train.epochs=4", "train.checkpoint_every=3", "eval.before=true"])
    out = tmp_path / "run"
    real = trainer.fault_point

    def stop(point):
        if point == "stage_end:0":
            raise KeyboardInterrupt
        real(point)

    monkeypatch.setattr(trainer, "fault_point", stop)
    with pytest.raises(KeyboardInterrupt):
        surecl.run(cfg, out, progress=False, cache_dir=tiny_cache, log_with=["tensorboard"])
    before = scalars(out / "tensorboard")
    assert [s for s, _ in before["train/loss"]] == list(range(1, 9))
    monkeypatch.setattr(trainer, "fault_point", real)
    results = surecl.run(cfg, out, progress=False, cache_dir=tiny_cache, log_with=["tensorboard"])
    got = scalars(out / "tensorboard")  # two event files, read in name order: the order the runs started
    assert len(list((out / "tensorboard" / "surecl").glob("events.out.tfevents.*"))) == 2  # one per process
    assert [s for s, _ in got["train/loss"]] == list(range(1, results["steps"] + 1))  # steps 7-8 trained twice, logged once
    assert [s for s, _ in got["accuracy/colors"]] == [0, 8, results["steps"]]  # before, after colors, after animals
    assert len(got["matrix/row0/colors"]) == 1 and len(got["summary/fp"]) == 1
    # the hyper-parameters once: each time accelerate's TensorBoard tracker is given them it writes
    # tensorboardX's hparams session folder and a folder with hparams.yml, and the resumed process is the same run
    folders = [p for p in (out / "tensorboard" / "surecl").iterdir() if p.is_dir()]
    assert len(folders) == 2 and len([p for p in folders if (p / "hparams.yml").exists()]) == 1
    logged = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert [v for _, v in got["train/loss"]] == pytest.approx(logged, abs=1e-6)  # the values the resumed run computed
    manifest = json.loads((out / ".surecl-manifest.json").read_text())
    assert "tracking.json" in manifest["paths"]


# ----------------------------------------------------------------------------- (f) in-memory datasets


def test_task_from_hf_reads_an_in_memory_dataset_as_data_hf_does(tmp_path):
    datasets = pytest.importorskip("datasets")
    from surecl.config import HFTaskConfig
    from surecl.data.hf import load_hf_task
    from surecl.data.tiny import tiny_stream

    colors = tiny_stream(n_train=24, n_test=8)[0]
    cols = lambda rows: {"review": [e.sentence for e in rows], "stars": [e.label for e in rows]}  # noqa: E731
    dd = datasets.DatasetDict(fit=datasets.Dataset.from_dict(cols(colors.train)), held=datasets.Dataset.from_dict(cols(colors.test)))
    got = Task.from_hf(dd, "colors", text_column="review", label_column="stars", train_split="fit", test_split="held",
                       instruction="Warm or cool? ")
    assert (got.name, got.labels, got.instruction, got.train, got.test) == ("colors", ["cool", "warm"], "Warm or cool? ", colors.train, colors.test)
    # the same rows saved to disk and read as a data.hf entry give the same task
    dd.save_to_disk(str(tmp_path / "colors"))
    spec = HFTaskConfig(path=str(tmp_path / "colors"), text_column="review", label_column="stars", train_split="fit", test_split="held",
                        instruction="Warm or cool? ")
    assert load_hf_task(spec).fingerprint() == got.fingerprint()
    # one Dataset with integer ClassLabel labels and a held-out fraction
    names = ["cool", "warm"]
    one = datasets.Dataset.from_dict({"text": [e.sentence for e in colors.train], "label": [names.index(e.label) for e in colors.train]})
    one = one.cast_column("label", datasets.ClassLabel(names=names))
    held = Task.from_hf(one, "colors", test_fraction=0.25)
    assert held.labels == names and len(held.test) == 6 and sorted(held.train + held.test, key=colors.train.index) == colors.train


@pytest.mark.parametrize(
    "dataset, kwargs, words",
    [
        ("dict", {"text_column": "body"}, ["Task.from_hf.text_column", "no column 'body'"]),
        ("one", {}, ["Task.from_hf.test_split", "no split 'test'", "test_fraction"]),
        ("dict", {"test_fraction": 1.5}, ["Task.from_hf", "test_fraction must be a number in [0, 1)"]),
        ("dict", {"labels": ["warm"]}, ["'cool' is not in its labels"]),
        ("list", {}, ["Task.from_hf", "expected a datasets.Dataset or DatasetDict, got list"]),
        ("dict", {"name": "../x"}, ["Task.from_hf", "task name '../x'"]),
    ],
)
def test_task_from_hf_bad_input_is_one_line(dataset, kwargs, words):
    datasets = pytest.importorskip("datasets")
    rows = {"text": ["the red", "the blue"] * 3, "label": ["warm", "cool"] * 3}
    source = {"dict": datasets.DatasetDict(train=datasets.Dataset.from_dict(rows), test=datasets.Dataset.from_dict(rows)),
              "one": datasets.Dataset.from_dict(rows), "list": [rows]}[dataset]
    name = kwargs.pop("name", "mine")
    with pytest.raises(SureclError) as err:
        Task.from_hf(source, name, **kwargs)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_in_memory_datasets_of_a_generation_stream(tmp_path, tiny_cache):
    """tasks=[DatasetDict] under data.kind=generate is read as a data.hf entry is: the label
    column holds each row's target text (it was refused: from_hf took classify and text only)."""
    datasets = pytest.importorskip("datasets")
    from surecl.data.loading import caller_tasks

    rows = {"text": ["the sky is", "grass is"] * 3, "label": ["blue and wide", "green"] * 3}
    dd = datasets.DatasetDict(train=datasets.Dataset.from_dict(rows), test=datasets.Dataset.from_dict(rows))
    [task] = caller_tasks([dd], surecl.build_config("tiny", ["data.kind=generate"]))
    assert (task.kind, task.labels, task.score_metric) == ("generate", [], "rouge_l")
    assert [e.label for e in task.test] == rows["label"] and [e.sentence for e in task.train] == rows["text"]
    assert Task.from_hf(dd, "sky", kind="generate", metric="exact_match").score_metric == "exact_match"
    with pytest.raises(SureclError, match="metric"):
        Task.from_hf(dd, "sky", kind="generate", metric="bleu")


def test_python_api_takes_in_memory_datasets(tmp_path, tiny_cache):
    datasets = pytest.importorskip("datasets")
    from surecl.data.tiny import tiny_stream

    colors, animals = tiny_stream(n_train=16, n_test=4)[:2]
    cols = lambda rows: {"text": [e.sentence for e in rows], "label": [e.label for e in rows]}  # noqa: E731
    dd = datasets.DatasetDict(train=datasets.Dataset.from_dict(cols(colors.train)), test=datasets.Dataset.from_dict(cols(colors.test)))
    mixed = [dd, Task.from_hf(datasets.Dataset.from_dict(cols(animals.train + animals.test)), "animals", test_fraction=0.2)]
    cfg = surecl.build_config("tiny,seq_lora", ["data.n_train=0", "data.n_test=0", "train.epochs=1"])
    results = surecl.run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, tasks=mixed)
    assert results["tasks"] == ["task0", "animals"]
    assert results["provenance"]["data"]["source"] == "python" and set(results["provenance"]["data"]["given"]) == {"task0", "animals"}
