"""The learner interface a method declares (``trains``, ``answers``, ``state``, ``exports``) and
the two run hooks any plugin may answer (``sample_replay``, ``input_prefix``): what each
declaration changes in the run, its manifest, results.json, the model cards and ``prompt.json``,
and what each hook changes in what is replayed and read. Methods here are registered for the
test and unregistered after it."""

from __future__ import annotations

import contextlib
import json

import pytest

from surecl import registry
from surecl.config import build_config
from surecl.errors import SureclError
from surecl.methods.base import Method, check_declarations
from surecl.plugins.base import Plugin
from surecl.trainer import ContinualRun

SMALL = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=4", "train.epochs=1"]


@contextlib.contextmanager
def registered(name: str, cls: type):
    registry.register_method(name, cls)
    try:
        yield
    finally:
        registry.unregister_method(name)


class OwnAnswers(Method):
    """Declares that its own weights answer (it swaps nothing in, but says so) and what it keeps."""

    name = "own_answers"
    answers = "own"
    state = ("a note per task",)
    exports = ("notes",)

    def export(self, ctx, results):
        (ctx.out_dir / "notes").write_text("one note\n")


def test_declared_answers_state_and_exports_reach_results_cards_and_manifest(tmp_path, tiny_cache):
    with registered("own_answers", OwnAnswers):
        cfg = build_config("tiny,slow_reservoir", [*SMALL, "method=own_answers", "eval.fast=true"])
        run = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
        assert "notes" in run.plugins.outputs(run)  # exports: the manifest's final outputs
        results = run.run()
    out = tmp_path / "run"
    assert results["learner"] == {"trains": "fast", "answers": "own", "state": ["a note per task"], "exports": ["notes"]}
    assert "fast" not in results and run.state.accuracy_fast is None  # answers="own": no fast row of a dual run
    assert (out / "notes").read_text() == "one note\n"
    manifest = json.loads((out / ".surecl-manifest.json").read_text())
    assert "notes" in json.dumps(manifest)
    card = (out / "adapters" / "slow" / "README.md").read_text()
    assert "measured with method `own_answers`'s own weights for each task (a note per task), not this adapter" in card
    spec = json.loads((out / "adapters" / "slow" / "prompt.json").read_text())["predictions"]
    assert spec["answered_by"] == "method" and spec["this_adapter_answered"] is False
    assert spec["method"] == {"name": "own_answers", "trains": "fast", "answers": "own"}


def test_the_learner_answers_by_default(tmp_path, tiny_cache):
    cfg = build_config("tiny,slow_reservoir", [*SMALL, "eval.fast=true"])
    results = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache).run()
    assert results["learner"] == {"trains": "fast", "answers": "learner", "state": [], "exports": []}
    assert "fast" in results
    card = (tmp_path / "run" / "adapters" / "slow" / "README.md").read_text()
    assert "measured with this adapter" in card


class TrainsBase(Method):
    """Full fine-tuning by declaration alone: no setup, no parameters of its own."""

    name = "trains_base"
    trains = "base"


def test_trains_base_bypasses_the_adapters_and_trains_the_base_weights(tmp_path, tiny_cache):
    with registered("trains_base", TrainsBase):
        cfg = build_config("tiny", [*SMALL, "method=trains_base", "dual.enabled=false", "model.dtype=fp32"])
        run = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert run.adapters.bypassed and run.adapters.exported() == []
    assert not any(rel.startswith("adapters/") for rel in run.plugins.outputs(run))
    base = set(map(id, run.adapters.base_parameters().values()))
    assert {id(p) for p in run.trained_params} == base
    assert not any(p.requires_grad for p in run.adapters.fast_params)


class TrainsOwnWithoutParameters(Method):
    name = "own_without_parameters"
    trains = "own"


def test_trains_own_without_parameters_is_one_line(tmp_path, tiny_cache):
    with registered("own_without_parameters", TrainsOwnWithoutParameters):
        cfg = build_config("tiny", [*SMALL, "method=own_without_parameters", "dual.enabled=false"])
        with pytest.raises(SureclError, match="trains='own' needs a parameters") as err:
            ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("attr", "value", "says"), [
    ("trains", "everything", "trains='everything' is not one of fast, base, own"),
    ("answers", "slow", "answers='slow' is not one of learner, own"),
    ("state", "snapshots", "state must be a tuple of non-empty strings"),
    ("exports", ("",), "exports must be a tuple of non-empty strings"),
])
def test_a_bad_declaration_is_one_line(attr, value, says):
    cls = type("Bad", (Method,), {"name": "bad", attr: value})
    with pytest.raises(SureclError, match=says) as err:
        check_declarations(cls)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ the hooks


class NewestFirst(Method):
    """Replays the buffer's first ``count`` entries instead of uniform draws."""

    name = "newest_first"
    drawn: list = []

    def sample_replay(self, ctx, stage, step, count):
        entries = list(ctx.policy.buffer.entries[:count])
        NewestFirst.drawn.append([(e.task, e.index) for e in entries])
        return entries


class Replayed(Plugin):
    name = "replayed"

    def __init__(self):
        super().__init__()
        self.seen = []

    def after_step(self, ctx, record):
        self.seen.append([(e.task, e.index) for e in record.replayed])


def test_a_method_answering_sample_replay_decides_what_is_replayed(tmp_path, tiny_cache):
    overrides = [*SMALL, "replay.every=1", "replay.batch_size=3"]
    spy = Replayed()
    with registered("newest_first", NewestFirst):
        cfg = build_config("tiny,reservoir", [*overrides, "method=newest_first"])
        ContinualRun(cfg, tmp_path / "mine", progress=False, cache_dir=tiny_cache, plugins=[spy]).run()
    assert any(spy.seen) and spy.seen == NewestFirst.drawn  # every step replayed the buffer's head, as the method drew it
    default = Replayed()
    ContinualRun(build_config("tiny,reservoir", overrides), tmp_path / "default", progress=False, cache_dir=tiny_cache, plugins=[default]).run()
    assert any(default.seen) and default.seen != spy.seen  # the policy's uniform draws differ


class Prefix(Plugin):
    """Puts token 7 before every prompt of task 1."""

    name = "prefix"

    def input_prefix(self, ctx, task):
        return (7,) if task == 1 else ()


def test_a_plugin_input_prefix_reaches_every_read_and_the_method_alone_is_left_out(tmp_path, tiny_cache):
    cfg = build_config("tiny,seq_lora", SMALL)
    run = ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, plugins=[Prefix()])
    encoded = run.train_sets.encoded
    assert run.train_sets[0] is encoded[0]  # no prefix: the encoded list itself
    assert [e.prompt for e in run.train_sets[1]] == [[7, *e.prompt] for e in encoded[1]]
    assert [e.prompt[0] for e in run.test_sets[1]] == [7] * len(run.test_sets[1])
    run.left_out = (run.method,)  # as while the learner's own weights answer: an extra plugin's prefix stays
    assert run.input_prefix(1) == (7,)
    run.left_out = (run.plugins.by_key["plugin:prefix"],)
    assert run.input_prefix(1) == ()
