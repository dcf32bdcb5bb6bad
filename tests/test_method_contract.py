"""The contract every registered method honours, one battery parametrised over the registry (as
PEFT's ``PeftCommonTester`` is over its tuners): a method joins by being registered.

Per method, at its defaults on the tiny stream: its config survives a round trip (``to_dict``,
``config.yaml``) with each of its options changed; ``--dry-run`` plans it; a bad value of its
options is one line naming the key; a run killed with SIGKILL mid-task resumes to exactly the
uninterrupted run's results, log, buffer and exports (and what it checkpointed of its own is
what its ``state`` declaration says: something, or nothing); and what it exports loads in plain
transformers + peft. The outside method is ``l2_prev`` of docs/extending.md, registered from a
module the CLI loads with ``--import`` (its option set on the command line)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from extension_example import MODULE, write_example
from fork_runs import Runs, outcome, started_from

from surecl import registry
from surecl.cli import main
from surecl.config import build_config, config_from_dict

OUTSIDE = "l2_prev"
BUILT_IN = registry.method_names()
METHODS = [*BUILT_IN, OUTSIDE]
OUTSIDE_OPTIONS = [f"{OUTSIDE}.lam=0.5"]
COMMON = ["--quiet", "data.tasks=[colors,animals,numbers]", "data.n_train=16", "data.n_test=8", "train.epochs=2",
          "train.checkpoint_every=2", "train.keep_checkpoints=1"]


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    """The example module's folder, on ``sys.path`` and imported (registering ``l2_prev``) for
    the module's in-process tests; unregistered at the end."""
    folder = write_example(tmp_path_factory.mktemp("plugins"))
    sys.path.insert(0, str(folder))
    sys.modules.pop(MODULE, None)
    __import__(MODULE)
    yield folder
    registry.unregister_method(OUTSIDE)
    registry.unregister_policy("extreme")
    sys.modules.pop(MODULE, None)
    sys.path.remove(str(folder))


def section_of(method: str) -> tuple[str, type] | None:
    spec = registry.method_spec(method)
    return (spec.key, spec.config) if spec.config is not None else None


def changed(value):
    """Another valid-looking value of an option's type."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 0.5
    return None


@pytest.mark.parametrize("method", METHODS)
def test_config_round_trip_with_every_option_changed(method, plugins, tmp_path):
    overrides, expect = [], {}
    section = section_of(method)
    if section:
        name, cls = section
        defaults = cls()
        for f in dataclasses.fields(cls):
            value = getattr(defaults, f.name)
            other = [v for v in cls.choices.get(f.name, ()) if v != value][:1] or [changed(value)]
            if other[0] is not None:
                overrides.append(f"{name}.{f.name}={str(other[0]).lower() if isinstance(other[0], bool) else other[0]}")
                expect[f.name] = other[0]
        assert expect or not dataclasses.fields(cls), f"{method}: no option of {cls.__name__} could be changed"
    cfg = build_config(f"tiny,{method}", overrides)
    assert cfg.method == method
    if section:
        assert {k: getattr(getattr(cfg, section[0]), k) for k in expect} == expect
    assert config_from_dict(cfg.to_dict()) == cfg
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml(), encoding="utf-8")
    assert build_config(str(saved)) == cfg


@pytest.mark.parametrize("method", METHODS)
def test_dry_run_plans_it(method, plugins, capsys):
    assert main(["run", "--dry-run", "--config", f"tiny,{method}"]) == 0
    assert f"method {method}" in capsys.readouterr().out


@pytest.mark.parametrize("method", METHODS)
def test_a_bad_option_is_one_line_naming_the_key(method, plugins, capsys):
    section = section_of(method)
    name = section[0] if section else method
    bad = [f"{name}.no_such_option=1"]
    if section:
        numeric = [f.name for f in dataclasses.fields(section[1]) if isinstance(getattr(section[1](), f.name), (int, float))
                   and not isinstance(getattr(section[1](), f.name), bool)]
        bad += [f"{name}.{k}=lots" for k in numeric]
    for item in bad:
        assert main(["run", "--dry-run", "--config", f"tiny,{method}", item]) == 2, item
        err = capsys.readouterr().err
        key = item.split("=")[0]
        assert err.count("\n") == 1 and err.startswith("surecl: error: ") and key in err, err


@pytest.fixture(scope="module")
def runs(tmp_path_factory, plugins):
    r = Runs(tmp_path_factory.mktemp("contract"), path=[str(plugins)])
    yield r
    r.close()


def kill_point(method: str) -> tuple[str, str]:
    """A SIGKILL point inside the last stage and the checkpoint the rerun resumes from."""
    cls = registry.method_class(method)
    stages = cls(registry.method_config(build_config(f"tiny,{method}"))).stages(3)
    last = len(stages) - 1
    step = 3 if last else 5  # 4 steps per task; MTL's single stage has 12
    return f"step:{stages[last].row}:{step}", f"stage-{last:04d}-step-{(step // 2) * 2:06d}"  # faults name the row, checkpoints the stage


@pytest.mark.parametrize("method", METHODS)
def test_killed_run_resumes_exactly_and_exports_load_in_peft(method, runs):
    runs.prefix = ["--import", MODULE] if method == OUTSIDE else []
    args = ["--config", f"tiny,{method}", *COMMON, *(OUTSIDE_OPTIONS if method == OUTSIDE else [])]
    full, killed = runs.root / f"{method}-full", runs.root / f"{method}-killed"
    rc, err = runs(full, args)
    assert rc == 0, err[-2000:]
    point, resume_at = kill_point(method)
    rc, err = runs(killed, args, kill_at=point)
    assert rc == -9, f"not killed at {point}: {rc} {err[-800:]}"
    # what the method checkpointed (mid-way through its last stage) is what it declares (``state``)
    declared, saved = registry.method_class(method).state, method_state(killed / "checkpoints" / resume_at)
    assert bool(declared) == bool(saved), f"{method} declares state {declared} and checkpoints {saved}"
    rc, err = runs(killed, args)
    assert rc == 0, err[-2000:]
    started_from(err, killed, resume_at)
    expected, got = outcome(full), outcome(killed)
    assert got == expected
    losses = [line["loss"] for line in expected["log"]]
    assert len(losses) == 12 and len(set(losses)) > 1  # it trained
    assert exports_load(full) >= 1


def method_state(folder: Path) -> list[str]:
    """The names of what a checkpoint holds of the method's own (its ``state_dict``): its meta's
    keys and its tensors' names."""
    from safetensors import safe_open

    meta = json.loads((folder / "meta.json").read_text())["components"].get("method") or {}
    with safe_open(str(folder / "tensors.safetensors"), "pt") as f:
        tensors = [k for k in f.keys() if k.startswith("method/")]
    return sorted(meta) + tensors


def exports_load(out: Path) -> int:
    """Load every exported adapter (PEFT format) on its base, and a whole exported model, with
    transformers + peft alone; each answers a forward with finite logits. Returns how many."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base_path = json.loads((out / "results.json").read_text())["model_path"]
    ids = torch.tensor([[1, 5, 9, 2]])
    loaded = 0
    for config in sorted(out.glob("adapters/*/adapter_config.json")):
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), str(config.parent))
        assert torch.isfinite(model(ids).logits).all(), config
        loaded += 1
    if (out / "model" / "config.json").is_file():
        assert torch.isfinite(AutoModelForCausalLM.from_pretrained(str(out / "model"))(ids).logits).all()
        loaded += 1
    for prompts in out.glob("adapters/*/prompts.safetensors"):
        assert load_file(str(prompts))["prefix"].ndim == 2
        loaded += 1
    return loaded


@pytest.mark.parametrize("method", METHODS)
def test_the_dry_runs_optimizer_line_says_what_the_run_does(method, plugins, tmp_path, capsys, monkeypatch):
    """A method that starts AdamW afresh at each task (its declared ``fresh_optimizer``) and
    the learning rate of its parameter groups: the dry run prints both as the run does them."""
    from surecl.step import TrainStep
    from surecl.trainer import ContinualRun

    options = ["data.tasks=[colors,animals]", "data.n_train=4", "data.n_test=4", "train.epochs=1"]
    resets = []
    real = TrainStep.reset
    monkeypatch.setattr(TrainStep, "reset", lambda self: (resets.append(1), real(self))[1])
    run = ContinualRun(build_config(f"tiny,{method}", options), tmp_path / "run", progress=False)
    run.run()
    assert main(["run", "--dry-run", "--config", f"tiny,{method}", *options]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("optimizer: "))
    assert ("fresh optimizer state per task" in line) == bool(resets), (line, len(resets))
    lrs = {group["lr"] for group in run.optimizer.param_groups}
    assert len(lrs) == 1 and line.startswith(f"optimizer: AdamW lr {lrs.pop():g}"), line
