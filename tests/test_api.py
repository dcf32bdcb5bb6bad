"""The package face: ``import surecl`` gives run, RunConfig, build_config, ContinualRun and
__version__ (loaded on first use, so the CLI's --help stays fast), and a RunConfig built in
Python is validated on construction."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_runs import caller_model_and_tasks

import surecl
from surecl.config import DualConfig, LoraConfig, ModelConfig, ReplayConfig, RunConfig, TrainConfig, build_config, preset_names
from surecl.errors import SureclError

ROOT = Path(__file__).resolve().parents[1]


def test_package_exports_the_public_names():
    import surecl.config
    import surecl.trainer

    assert surecl.run is surecl.trainer.run
    assert surecl.ContinualRun is surecl.trainer.ContinualRun
    assert surecl.RunConfig is surecl.config.RunConfig
    assert surecl.build_config is surecl.config.build_config
    assert surecl.SureclError is SureclError
    assert {"run", "RunConfig", "build_config", "ContinualRun", "__version__"} <= set(surecl.__all__) <= set(dir(surecl))
    with pytest.raises(AttributeError):
        surecl.no_such_name  # noqa: B018


def test_version_is_the_installed_distribution_s():
    assert surecl.__version__ == importlib.metadata.version("surecl")


def test_version_falls_back_to_pyproject(monkeypatch):
    tomllib = pytest.importorskip("tomllib")

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    from surecl._version import version

    assert version() == declared


def test_import_surecl_loads_no_torch():
    """The heavy names load on first use: ``import surecl`` (and so ``surecl --help``) must not
    pull in torch (about 1.7 s here) or the trainer (5.4 s)."""
    code = "import sys, surecl; print('torch' in sys.modules, 'surecl.trainer' in sys.modules, surecl.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["False", "False"], out
    code = "import sys, surecl; surecl.build_config; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"train": TrainConfig(lr=-1)}, "train.lr"),
        ({"train": TrainConfig(lr="fast")}, "train.lr"),
        ({"train": TrainConfig(epochs=True)}, "train.epochs"),
        ({"dual": DualConfig(beta=1.5)}, "dual.beta"),
        ({"replay": ReplayConfig(policy="nosuch")}, "replay.policy"),
        ({"lora": LoraConfig(target_modules="q_proj")}, "lora.target_modules"),
        ({"model": ModelConfig(max_length=4)}, "model.max_length"),
        ({"method": "nosuch"}, "method"),
        ({"train": {"lr": 1e-3}}, "train"),
    ],
)
def test_runconfig_validates_on_construction(kwargs, key):
    with pytest.raises(SureclError) as err:
        RunConfig(**kwargs)
    message = str(err.value)
    assert message.startswith(f"{key}:"), message
    assert "\n" not in message


def test_runconfig_built_in_python_equals_the_same_overrides():
    cfg = RunConfig(model=ModelConfig(name="tiny"), train=TrainConfig(lr=1, epochs=2), replay=ReplayConfig(policy="surprise", buffer_size=8))
    built = build_config("seq_lora", ["model.name=tiny", "train.lr=1", "train.epochs=2", "replay.policy=surprise", "replay.buffer_size=8"])
    built.preset = ""
    assert cfg.to_dict() == built.to_dict()


@pytest.mark.parametrize("name", preset_names())
def test_construction_time_validation_keeps_every_preset_buildable(name):
    """build_config starts from a default RunConfig and validates after presets and overrides,
    so combinations that pass through invalid states (score_time=after needs insert_time=after)
    still build."""
    cfg = build_config(f"tiny,{name}", ["replay.score_time=after", "replay.insert_time=after"])
    assert cfg.replay.score_time == "after"


def test_api_run_end_to_end(tmp_path, tiny_cache):
    cfg = surecl.build_config("tiny,seq_lora", ["data.tasks=[colors]", "data.n_train=8", "data.n_test=4"])
    results = surecl.run(cfg, tmp_path / "api", progress=False, cache_dir=tiny_cache)
    assert results["tasks"] == ["colors"] and len(results["accuracy_matrix"]) == 1
    assert (tmp_path / "api" / "results.json").is_file()


def test_continual_run_trains_a_caller_built_model_on_caller_built_tasks(tmp_path):
    from peft import PeftModel

    model, tokenizer, tasks = caller_model_and_tasks()
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = surecl.build_config("tiny,seq_lora", ["data.n_train=0", "data.n_test=0", "train.epochs=8", "train.lr=0.01",
                                                "eval.mode=rank"])
    cr = surecl.ContinualRun(cfg, tmp_path / "mine", progress=False, model=model, tokenizer=tokenizer, tasks=tasks)
    results = cr.run()
    assert results["tasks"] == ["temperature", "heading"]
    assert results["accuracy_matrix"][0][0] == 100.0 and results["accuracy_matrix"][1][1] == 100.0, results["accuracy_matrix"]
    trained = cr.peft_model
    assert isinstance(trained, PeftModel)
    # the base stayed frozen; the trained adapter answers: "hot" -> "up" through the PEFT model directly
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    from surecl.data.encode import build_prompt

    ids = tokenizer(build_prompt(tasks[1], "north"), return_tensors="pt")
    assert tokenizer.unk_token_id not in ids["input_ids"][0].tolist()
    assert (tmp_path / "mine" / "results.json").is_file() and trained.training is False
    with torch.no_grad():
        logits = trained(**ids).logits[0, -1]
    assert logits[tokenizer.convert_tokens_to_ids("up")] > logits[tokenizer.convert_tokens_to_ids("down")]


def test_caller_inputs_are_checked(tmp_path):
    model, tokenizer, tasks = caller_model_and_tasks()
    cfg = surecl.build_config("tiny,seq_lora", [])
    with pytest.raises(SureclError, match="pass both"):
        surecl.ContinualRun(cfg, tmp_path / "a", progress=False, model=model, tasks=tasks)
    with pytest.raises(SureclError, match="tasks: expected a list"):
        surecl.ContinualRun(cfg, tmp_path / "b", progress=False, model=model, tokenizer=tokenizer, tasks=["not a task"])
    with pytest.raises(SureclError, match="expected a transformers model"):
        surecl.ContinualRun(cfg, tmp_path / "c", progress=False, model=object(), tokenizer=tokenizer, tasks=tasks)
