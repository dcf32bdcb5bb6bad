"""docs/extending.md's example, run as written: an outside method and an outside quota policy
with their own options, registered from a module the CLI loads with ``--import``."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch
from extension_example import MODULE, write_example

from surecl import registry
from surecl.cli import main
from surecl.config import build_config, config_from_dict
from surecl.errors import SureclError
from surecl.plugins.base import Plugin
from surecl.trainer import ContinualRun


@pytest.fixture
def my_cl(tmp_path, monkeypatch):
    """The example imported (it registers ``l2_prev`` and ``extreme``); unregistered afterwards."""
    monkeypatch.syspath_prepend(str(write_example(tmp_path / "plugins")))
    sys.modules.pop(MODULE, None)
    module = importlib.import_module(MODULE)
    yield module
    registry.unregister_method("l2_prev")
    registry.unregister_policy("extreme")
    sys.modules.pop(MODULE, None)


def test_outside_options_work_like_built_in_ones(my_cl):
    cfg = build_config("tiny,l2_prev", ["l2_prev.lam=0.5", "replay.policy=extreme", "extreme.keep=high"])
    assert (cfg.method, cfg.l2_prev.lam, cfg.replay.policy, cfg.extreme.keep) == ("l2_prev", 0.5, "extreme", "high")
    assert config_from_dict(cfg.to_dict()) == cfg  # saved configs read back
    assert cfg.to_dict()["l2_prev"] == {"lam": 0.5}
    with pytest.raises(SureclError, match=r"^l2_prev.lam: -1.0 must be >= 0$"):
        build_config("tiny,l2_prev", ["l2_prev.lam=-1"])
    with pytest.raises(SureclError, match=r"^extreme.keep: 'middle' is not one of low, high$"):
        build_config("tiny", ["replay.policy=extreme", "extreme.keep=middle"])
    assert "l2_prev" in registry.method_names() and "extreme" in registry.policy_names()
    # it ranks by scores but re-scores nothing on replay: aging would be accepted and do nothing
    with pytest.raises(SureclError, match=r"^replay.aging: policy extreme ranks by scores but does not re-score"):
        build_config("tiny", ["replay.policy=extreme", "replay.aging=true"])


def test_the_cli_finds_them_with_import(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(write_example(tmp_path / "plugins")))
    sys.modules.pop(MODULE, None)
    try:
        assert main(["--import", MODULE, "run", "--dry-run", "--config", "tiny,l2_prev", "l2_prev.lam=0.25"]) == 0
        out = capsys.readouterr().out
        assert "method l2_prev" in out and "l2_prev:\n  lam: 0.25" in out
        assert main(["run", "--import", MODULE, "--dry-run", "--config", "tiny,l2_prev", "l2_prev.lam=-1"]) == 2
        err = capsys.readouterr().err
        assert err == "surecl: error: l2_prev.lam: -1.0 must be >= 0\n"
        assert main(["list"]) == 0 and "l2_prev" in capsys.readouterr().out
    finally:
        registry.unregister_method("l2_prev")
        registry.unregister_policy("extreme")
        sys.modules.pop(MODULE, None)
    assert main(["--import", "no_such_module_here", "list"]) == 2
    assert "--import no_such_module_here: ModuleNotFoundError" in capsys.readouterr().err


def test_the_policy_ranks_by_its_option(my_cl):
    low, high = (my_cl.ExtremeSurprise(build_config("tiny").replay, 4, 0) for _ in range(2))
    low.options, high.options = my_cl.ExtremeOptions("low"), my_cl.ExtremeOptions("high")
    surprise = [1.0, 5.0, 3.0]
    assert low.priorities(0, 3, lambda t: surprise) == [-1.0, -5.0, -3.0]
    assert high.priorities(0, 3, lambda t: surprise) == surprise


class Snapshot(Plugin):
    """An extra plugin: the trained weights as the second task starts."""

    name = "snapshot"
    before_second: list[torch.Tensor] = []

    def before_task(self, ctx, stage):
        if stage.row == 1:
            self.before_second = [p.detach().clone() for p in ctx.trained_params]


def drift(my_cl, tmp_path, tiny_cache, lam: float) -> tuple[float, ContinualRun]:
    snap = Snapshot()
    cfg = build_config("tiny,l2_prev", ["data.tasks=[colors,animals]", "data.n_train=32", "data.n_test=8", "train.epochs=3",
                                       f"l2_prev.lam={lam}", "replay.policy=extreme", "replay.buffer_size=8"])
    run = ContinualRun(cfg, tmp_path / f"lam{lam}", progress=False, cache_dir=tiny_cache, plugins=[snap])
    run.run()
    moved = sum(float(((p.detach() - a) ** 2).sum()) for p, a in zip(run.trained_params, snap.before_second))
    return moved, run


def test_the_method_pulls_and_the_policy_keeps_the_least_surprising(my_cl, tmp_path, tiny_cache):
    free, _ = drift(my_cl, tmp_path, tiny_cache, 0.0)
    pulled, run = drift(my_cl, tmp_path, tiny_cache, 100.0)
    assert free > 0 and pulled < 0.2 * free  # the pull held the adapter near where task 1 left it
    entries = run.policy.buffer.entries
    assert entries and all(e.score <= 0 for e in entries)  # priorities are minus the surprise (keep=low)
    assert {e.task for e in entries} == {0, 1}


def test_a_method_that_checkpoints_undeclared_state_is_warned_once(my_cl, tmp_path, tiny_cache, monkeypatch, caplog):
    """l2_prev without its ``state`` declaration: its checkpoints hold the anchor, and the run
    says (once) that the learner record and model cards will claim it keeps nothing."""
    with caplog.at_level("WARNING", logger="surecl"):
        drift(my_cl, tmp_path / "declared", tiny_cache, 1.0)
    assert not [r for r in caplog.records if "declares none" in r.getMessage()]
    monkeypatch.setattr(my_cl.L2Prev, "state", ())
    with caplog.at_level("WARNING", logger="surecl"):
        drift(my_cl, tmp_path / "undeclared", tiny_cache, 1.0)
    said = [r.getMessage() for r in caplog.records if "declares none" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("method l2_prev checkpoints state of its own (anchor.0, anchor.1, anchor.10)"), said


def test_a_sweep_runs_an_outside_method_by_name(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(write_example(tmp_path / "plugins")))
    sys.modules.pop(MODULE, None)
    try:
        argv = ["--import", MODULE, "sweep", "--config", "tiny", "--methods", "l2_prev", "--out", str(tmp_path / "sweep"), "--quiet",
                "--grid", "l2_prev.lam=0,10", "data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=4", "train.epochs=1"]
        assert main(argv) == 0, capsys.readouterr().err
    finally:
        registry.unregister_method("l2_prev")
        registry.unregister_policy("extreme")
        sys.modules.pop(MODULE, None)
    done = sorted(p.parent.relative_to(tmp_path / "sweep").as_posix() for p in (tmp_path / "sweep").rglob("results.json"))
    assert len(done) == 2 and all(p.startswith("l2_prev") for p in done), done
    lams = sorted(json.loads((tmp_path / "sweep" / p / "results.json").read_text())["config"]["l2_prev"]["lam"] for p in done)
    assert lams == [0.0, 10.0]
