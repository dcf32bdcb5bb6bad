"""The bad-input corpus: each case gets a one-line error, exit code 2, no traceback, and a
pre-existing output directory stays byte-for-byte unchanged."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from surecl.cli import main


def write_benchmark(root: Path, mutate=None) -> Path:
    """A valid two-task CL_Benchmark folder; ``mutate(root)`` breaks it."""
    (root / "TC" / "topics").mkdir(parents=True)
    (root / "SC" / "moods").mkdir(parents=True)
    json.dump({"TC": [{"instruction": "Topic? "}], "SC": [{"instruction": "Mood? "}]}, open(root / "instruction_config.json", "w"))
    for task, labels in (("TC/topics", ["warm", "cool"]), ("SC/moods", ["pet", "wild"])):
        rows = [{"sentence": f"text {i}", "label": labels[i % 2]} for i in range(6)]
        for split in ("train", "test"):
            json.dump(rows, open(root / task / f"{split}.json", "w"))
        json.dump(labels, open(root / task / "labels.json", "w"))
    if mutate:
        mutate(root)
    return root


def put(path: str, content: bytes | str):
    def mutate(root: Path) -> None:
        p = root / path
        p.write_bytes(content if isinstance(content, bytes) else content.encode())

    return mutate


def put_json(path: str, obj):
    return put(path, json.dumps(obj))


TINY = ["--config", "tiny,seq_lora"]
CASES = {
    # name: (extra argv, benchmark mutation or None, expected words in the message)
    "malformed json": ([], put("TC/topics/train.json", "[{"), ["topics/train.json", "malformed JSON"]),
    "row without label": ([], put_json("TC/topics/train.json", [{"sentence": "x"}]), ["row 0", "missing 'label'"]),
    "row without sentence": ([], put_json("TC/topics/test.json", [{"label": "cool"}]), ["row 0", "missing 'sentence'"]),
    "label outside labels.json": ([], put_json("TC/topics/train.json", [{"sentence": "x", "label": "cooking"}]), ["'cooking'", "not in its labels"]),
    "many labels outside labels.json": (
        [], put_json("TC/topics/test.json", [{"sentence": "x", "label": "cool"}] + [{"sentence": "y", "label": "-"}] * 3),
        ["test row 1", "'-'", "3 such rows", "data.invalid_labels=drop"],
    ),
    "every row dropped leaves an empty split": (
        ["data.invalid_labels=drop"], put_json("TC/topics/test.json", [{"sentence": "y", "label": "-"}] * 2), ["topics", "empty test split"],
    ),
    "unknown invalid_labels choice": (["data.invalid_labels=keep"], None, ["data.invalid_labels", "'keep'"]),
    "empty train split": ([], put_json("SC/moods/train.json", []), ["moods", "empty train split"]),
    "empty test split": ([], put_json("SC/moods/test.json", []), ["moods", "empty test split"]),
    "rows not a list": ([], put_json("SC/moods/train.json", {"a": 1}), ["expected a JSON list"]),
    "labels not a list": ([], put_json("SC/moods/labels.json", "pet"), ["labels.json", "list of label strings"]),
    "not utf-8": ([], put("TC/topics/train.json", b'[{"sentence": "caf\xe9", "label": "cool"}]'), ["not UTF-8"]),
    "utf-16 (a Windows editor's Unicode)": ([], put("TC/topics/train.json", '[{"sentence": "hot", "label": "cool"}]'.encode("utf-16")),
                                            ["topics/train.json", "looks like UTF-16, not UTF-8: save it as UTF-8"]),
    "lone surrogate escape": ([], put("TC/topics/train.json", b'[{"sentence": "bad \\ud800 text", "label": "cool"}]'),
                              ["topics/train.json row 0", "'sentence'", "invalid Unicode"]),
    "lone surrogate in labels.json": ([], put("SC/moods/labels.json", b'["ok", "\\udc00"]'), ["labels.json label 1", "invalid Unicode"]),
    "manifest with an empty order": ([], put_json("MANIFEST.json", {"order": []}), ["MANIFEST.json", "non-empty list"]),
    "an order on the tiny benchmark": (["data.benchmark=tiny", "data.order=3"], None, ["data.order", "tiny benchmark has one order", "'3'"]),
    "missing instruction for group": ([], put_json("instruction_config.json", {"TC": ["Topic? "]}), ["no instruction for group 'SC'"]),
    "task named twice": (["data.tasks=[topics,moods,topics]"], None, ["named twice", "topics"]),
    "task missing from folder": (["data.tasks=[topics,weather]"], None, ["lacks task", "weather"]),
    "task name with path separator": (["data.tasks=[../topics]"], None, ["../topics"]),
    "unknown order": (["data.order=9"], None, ["data.order", "'9'"]),
    "unknown preset": (["--config", "tiny,nosuch"], None, ["unknown preset 'nosuch'"]),
    "unknown method": (["method=nosuch"], None, ["method", "nosuch"]),
    "unknown config key": (["replay.bufer_size=3"], None, ["bufer_size"]),
    "mistyped value": (["train.lr=fast"], None, ["train.lr", "'fast'"]),
    "negative buffer": (["replay.buffer_size=-1"], None, ["replay.buffer_size", "-1"]),
    "beta above one": (["dual.beta=1.5"], None, ["dual.beta", "(0, 1)"]),
    "beta zero": (["dual.beta=0"], None, ["dual.beta"]),
    "replay every zero": (["replay.every=0"], None, ["replay.every", ">= 1"]),
    "insert before score after": (["replay.score_time=after", "replay.insert_time=before"], None, ["replay.insert_time"]),
    "override without equals": (["replay.every"], None, ["key.sub=value"]),
    "model path missing": (["model.name=/nonexistent/model"], None, ["model.name", "/nonexistent/model"]),
    "benchmark folder missing": (["data.benchmark=/nonexistent/bench"], "skip-bench", ["/nonexistent/bench", "does not exist"]),
    "not a benchmark folder": ([], lambda root: (root / "instruction_config.json").unlink(), ["instruction_config.json"]),
    "task name in two groups": ([], lambda root: shutil.copytree(root / "TC" / "topics", root / "SC" / "topics"),
                                ["two tasks named 'topics'", "SC/topics", "TC/topics"]),
    "benchmark manifest not an object": ([], put_json("MANIFEST.json", ["topics", "moods"]), ["MANIFEST.json", "'order' is a non-empty list"]),
    "jsonl missing": (["data.jsonl=[/nonexistent.jsonl]"], None, ["/nonexistent.jsonl", "does not exist"]),
    "config file missing": (["--config", "/nonexistent.yaml"], None, ["/nonexistent.yaml", "does not exist"]),
    "text stream scored by accuracy": (["data.kind=text"], None, ["eval.mode", "perplexity"]),
    "perplexity of a labelled stream": (["eval.mode=perplexity"], None, ["eval.mode", "data.kind='classify'"]),
    "unknown data kind": (["data.kind=audio"], None, ["data.kind", "'audio'"]),
    "online policy on whole sequences": (["replay.policy=online_surprise"], None, ["replay.scope", "online_surprise"]),
    "progressive prompts with the dual learner": (
        ["dual.enabled=true", "--config", "tiny,progressive_prompts"], None, ["dual.enabled", "progressive_prompts", "soft prompts"],
    ),
    "prompt length zero": (["method=progressive_prompts", "prompts.length=0"], None, ["prompts.length", ">= 1"]),
    "unknown prompts.eval": (["method=progressive_prompts", "prompts.eval=task"], None, ["prompts.eval", "'task'"]),
    "full fine-tuning with the dual learner": (["dual.enabled=true", "--config", "tiny,seq_ft"], None, ["dual.enabled", "seq_ft"]),
    "full fine-tuning of bf16 weights": (["model.dtype=bf16", "--config", "tiny,seq_ft"], None, ["model.dtype", "seq_ft", "fp32"]),
    "no checkpoint kept": (["train.keep_checkpoints=0"], None, ["train.keep_checkpoints", ">= 1"]),
    "negative weight decay": (["train.weight_decay=-1"], None, ["train.weight_decay", ">= 0"]),
    "LoRA on an embedding": (["lora.target_modules=[q_proj,embed_tokens]"], None, ["lora.target_modules", "embed_tokens, not a linear layer"]),
    "LoRA on a block of layers": (["lora.target_modules=[self_attn]"], None, ["lora.target_modules", "not a linear layer"]),
    "per-task epochs of a task up to case": (["train.epochs_per_task=[Topics:2]"], None, ["train.epochs_per_task", "'Topics'", "did you mean 'topics'"]),
    "N-LoRA strengths of a task up to case": (["nlora.per_task=[MOODS:0.1]", "--config", "tiny,nlora"], None, ["nlora.per_task", "did you mean 'moods'"]),
    "O-LoRA with the dual learner": (["dual.enabled=true", "--config", "tiny,olora"], None, ["dual.enabled", "olora", "dual.enabled=false"]),
    "N-LoRA with the dual learner": (["dual.enabled=true", "--config", "tiny,nlora"], None, ["dual.enabled", "nlora"]),
    "N-LoRA's code form on a non-square module": (["nlora.l1_of=ab", "--config", "tiny,nlora"], None, ["nlora.l1_of", "in == out"]),
    "unknown O-LoRA norm": (["olora.orth_norm=l2", "--config", "tiny,olora"], None, ["olora.orth_norm", "'l2'"]),
}


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def existing_out(tmp_path) -> Path:
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / ".surecl-lock").write_text("{}")  # an earlier run's folder: its report and log are surecl's
    (out / "report.md").write_text("an earlier report")
    (out / "log.jsonl").write_text('{"step": 0}\n')
    (out / "checkpoints" / "note.txt").write_text("keep me")
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2_and_leaves_outputs(case, tmp_path, existing_out, capsys, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    extra, mutate, words = CASES[case]
    bench = write_benchmark(tmp_path / "bench", None if mutate in (None, "skip-bench") else mutate)
    config = []
    if "--config" not in extra:
        config = TINY
    argv = ["run", *config, "--out", str(existing_out), "--quiet", f"data.benchmark={bench}"]
    argv += [a for a in extra]
    before = tree_digest(existing_out)
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("surecl: error: ")
    for word in words:
        assert word in err[0], (word, err[0])
    assert tree_digest(existing_out) == before


def test_output_path_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "file.txt"
    target.write_text("data")
    assert main(["run", *TINY, "--out", str(target)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert target.read_text() == "data"


def test_unwritable_output_directory(capsys):
    # /proc is read-only even for root, so this holds whoever runs the tests.
    assert main(["run", *TINY, "--out", "/proc/surecl-out"]) == 2
    assert "not writable" in capsys.readouterr().err


def test_finished_run_with_other_config_is_not_overwritten(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main(["run", *TINY, "--out", str(out), "--quiet", "data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.epochs=1"]) == 0
    before = tree_digest(out)
    assert main(["run", *TINY, "--out", str(out), "--quiet", "data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.epochs=2"]) == 2
    assert "different config" in capsys.readouterr().err
    assert tree_digest(out) == before


def test_subprocess_prints_no_traceback_and_debug_does(tmp_path):
    env_cmd = [sys.executable, "-m", "surecl.cli"]
    bad = subprocess.run(env_cmd + ["run", "--config", "tiny,seq_lora", "dual.beta=2"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and "dual.beta" in bad.stderr
    debug = subprocess.run(env_cmd + ["--debug", "run", "--config", "tiny,seq_lora", "dual.beta=2"], capture_output=True, text=True)
    assert "Traceback" in debug.stderr


def test_invalid_labels_drop_skips_those_rows_and_says_so(tmp_path, capsys, monkeypatch):
    """MNLI's test split labels rows without a gold label '-': with data.invalid_labels=drop
    the run skips them, prints how many, and evaluates on the rest."""
    from surecl.data.cl_benchmark import load_benchmark

    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    rows = [{"sentence": f"text {i}", "label": ["warm", "cool"][i % 2]} for i in range(6)] + [{"sentence": "?", "label": "-"}] * 3
    bench = write_benchmark(tmp_path / "bench", put_json("TC/topics/test.json", rows))
    tasks = load_benchmark(bench, invalid_labels="drop")
    topics = next(t for t in tasks if t.name == "topics")
    assert len(topics.test) == 6 and all(ex.label in topics.labels for ex in topics.test)
    assert topics.meta["dropped"] == {"test": 3}
    out = tmp_path / "out"
    argv = ["run", *TINY, "--out", str(out), "--quiet", f"data.benchmark={bench}", "data.invalid_labels=drop", "train.epochs=1"]
    assert main(argv) == 0
    assert "topics: dropped 3 test rows" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["tasks"] == ["moods", "topics"]
