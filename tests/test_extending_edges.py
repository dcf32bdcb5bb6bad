"""An outside method written from docs/extending.md alone, at the edges the page promises:
what a ``trains="own"`` / ``"base"`` method trains survives a kill and resume without a
``state_dict`` of its own, ``"base"`` makes the base trainable, option types beyond strings,
state that shares memory or holds integer keys, and errors naming a class by its registered
name."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch
from tiny_runs import stopped_at

import surecl
from surecl import registry
from surecl.config import build_config
from surecl.errors import SureclError
from surecl.trainer import run

SMALL = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", "train.epochs=2", "train.checkpoint_every=2",
         "replay.policy=none", "dual.enabled=false", "eval.before=false"]


class _Holder(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(n))


class OwnScale(surecl.Method):
    """Trains a per-feature scale of the input embeddings, a module of its own; no state_dict."""

    name = "own_scale"
    trains = "own"

    def setup(self, ctx):
        emb = ctx.model.get_input_embeddings()
        self.holder = _Holder(emb.weight.shape[1])
        ctx.model.add_module("own_scale_holder", self.holder)
        emb.register_forward_hook(lambda m, i, o: o * self.holder.scale.to(o.dtype))

    def parameters(self, ctx):
        return [self.holder.scale]


class FullFT(surecl.Method):
    """``trains="base"`` as documented: nothing of its own (no setup, the default parameters)."""

    name = "full_ft_plain"
    trains = "base"


def _losses(out):
    return [(r["stage"], r["step"], r["loss"]) for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r]


def _killed_and_resumed(cfg, out, cache, monkeypatch, point):
    stopped_at(monkeypatch, point, lambda: run(cfg, out, progress=False, cache_dir=cache))
    return run(cfg, out, progress=False, cache_dir=cache)


@pytest.mark.parametrize("method, extra", [("own_scale", []), ("full_ft_plain", ["model.dtype=fp32", "train.lr=0.001"])])
def test_what_an_own_or_base_method_trains_survives_a_resume(registered, tiny_cache, tmp_path, monkeypatch, method, extra):
    """A method training its own module or the base weights checkpoints no state of its own; the
    run keeps what it trains, so a run killed mid-task resumes to the uninterrupted run's losses
    (the weights were back at their start: the scale at 1, the base pretrained)."""
    registered("own_scale", OwnScale)
    registered("full_ft_plain", FullFT)
    cfg = build_config(f"tiny,{method}", SMALL + extra)
    whole = run(cfg, tmp_path / "whole", progress=False, cache_dir=tiny_cache)
    again = _killed_and_resumed(cfg, tmp_path / "killed", tiny_cache, monkeypatch, "step:1:3")
    got, want = _losses(tmp_path / "killed"), _losses(tmp_path / "whole")
    assert [g[:2] for g in got] == [w[:2] for w in want] and [g[2] for g in got] == pytest.approx([w[2] for w in want], rel=1e-5)
    assert again["accuracy_matrix"] == whole["accuracy_matrix"]
    first = [loss for stage, step, loss in _losses(tmp_path / "whole") if stage == 0]
    assert first[-1] < first[0]  # it learned something a lost resume would undo


def test_base_trains_the_base_weights_without_a_setup(registered, tiny_cache, tmp_path):
    """``trains="base"`` with the default parameters trained nothing: the base weights kept
    requires_grad False and the step's backward raised a traceback."""
    registered("full_ft_plain", FullFT)
    res = run(build_config("tiny,full_ft_plain", SMALL + ["model.dtype=fp32", "train.lr=0.001"]), tmp_path / "run",
              progress=False, cache_dir=tiny_cache)
    losses = [loss for stage, _, loss in _losses(tmp_path / "run") if stage == 0]
    assert losses[-1] < losses[0] and res["accuracy_matrix"][0][0] is not None


@dataclass
class TypedOptions(surecl.Options):
    layers: list[int] = field(default_factory=lambda: [1, 2])
    weights: list[float] = field(default_factory=lambda: [0.5])
    cap: int | None = None


class Typed(surecl.Method):
    name, Config = "typed", TypedOptions


@dataclass
class TupleOptions(surecl.Options):
    sizes: tuple[int, ...] = (1, 2)


class Tupled(surecl.Method):
    name, Config = "tupled", TupleOptions


def test_options_of_numbers_lists_and_none(registered):
    """list[int] / list[float] options stopped every config ("expected a list of strings") once
    registered, and ``int | None`` could not be set back to null."""
    registered("typed", Typed)
    cfg = build_config("tiny,typed", ["typed.layers=[3,4]", "typed.weights=[0.1,2]", "typed.cap=5"])
    assert (cfg.typed.layers, cfg.typed.weights, cfg.typed.cap) == ([3, 4], [0.1, 2.0], 5)
    assert build_config("tiny,typed", ["typed.cap=5", "typed.cap=null"]).typed.cap is None
    assert build_config("tiny,seq_lora").typed.layers == [1, 2]  # another method's config builds with the section there
    with pytest.raises(SureclError, match=r"^typed.layers: expected an integer, got 'x'$"):
        build_config("tiny,typed", ["typed.layers=[1,x]"])


def test_an_option_type_no_config_can_give_is_refused_at_registration():
    with pytest.raises(TypeError, match=r"option tupled.sizes is a tuple\[int, \.\.\.\], which config files and overrides cannot give"):
        surecl.register_method("tupled", Tupled)
    assert "tupled" not in registry.method_names()


class Shared(surecl.Method):
    """Its state names one tensor twice (an anchor and a 'best' that is the same tensor)."""

    name = "shared_state"
    state = ("the anchor", "the best weights")
    anchor = None

    def after_step(self, ctx, record):
        self.anchor = [p.detach().clone() for p in ctx.trained_params]

    def state_dict(self):
        tensors = {f"anchor.{i}": a for i, a in enumerate(self.anchor or [])}
        tensors.update({f"best.{i}": a for i, a in enumerate(self.anchor or [])})
        return {}, tensors


class IntKeys(surecl.Method):
    name = "int_keys"
    state = ("rows seen per task",)

    def state_dict(self):
        return {"seen": {0: 1}}, {}


def test_state_sharing_memory_is_written_and_integer_keys_are_one_line(registered, tiny_cache, tmp_path):
    """safetensors refuses two names for one tensor (a traceback from the checkpoint writer, the
    task's training lost); JSON turns an int key into a string, so a resumed run read another
    state without a word."""
    registered("shared_state", Shared)
    registered("int_keys", IntKeys)
    res = run(build_config("tiny,shared_state", SMALL), tmp_path / "shared", progress=False, cache_dir=tiny_cache)
    assert res["accuracy_matrix"][1][1] is not None and any((tmp_path / "shared" / "checkpoints").iterdir())
    with pytest.raises(SureclError, match=r"^method plugin 'int_keys': its state_dict's meta holds the key 0, not a string"):
        run(build_config("tiny,int_keys", SMALL), tmp_path / "int", progress=False, cache_dir=tiny_cache)


class Unnamed(surecl.Method):
    def loss(self, ctx, loss):
        return None


def test_a_class_without_a_name_is_named_as_registered(registered, tiny_cache, tmp_path):
    registered("no_name_here", Unnamed)
    with pytest.raises(SureclError, match=r"^method plugin 'no_name_here': its loss hook returned None"):
        run(build_config("tiny,no_name_here", SMALL), tmp_path / "run", progress=False, cache_dir=tiny_cache)


class KeepFirst(surecl.ReplayPolicy):
    """Neither a per-task quota nor online: keeps the first rows it is shown, its own rule."""

    name = "keep_first"


def test_the_dry_run_does_not_plan_a_policy_of_its_own_rule(registered, capsys):
    """The dry run planned an outside policy's buffer as an online one ("online", replay steps
    counted from the second step); it now says it does not plan it."""
    from surecl.cli import main

    registered("keep_first", KeepFirst)
    assert main(["run", "--dry-run", "--config", "tiny,seq_lora", "replay.policy=keep_first", "data.tasks=[colors,animals]"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | animals |" in out and "| ? | its own (keep_first: neither a per-task quota nor online; not planned) |" in out
    assert "| online |" not in out
