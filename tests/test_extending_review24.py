"""The plugin API's review 24: what a plugin author gets wrong is refused where it is made (at
registration, one line, an entry point's a warning), a hook's wrong return is one line naming
the plugin, and a run made while an unrelated plugin was loaded stays finished or resumable once
the plugin is gone."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import sys
import textwrap
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from tiny_runs import stopped_at

import surecl
from surecl import registry
from surecl.cli import main
from surecl.config import RunConfig, build_config, same_config
from surecl.errors import SureclError
from surecl.plugins.base import Plugin, Plugins
from surecl.replay.buffer import ReservoirBuffer
from surecl.sections import ReplayConfig
from surecl.step import StepConfig, TrainStep
from surecl.trainer import ContinualRun, run

SMALL = ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=4", "train.epochs=1", "eval.before=false"]


@pytest.fixture(autouse=True)
def _no_leftovers():
    """Whatever a test registered, even what it expected refused, is gone after it."""
    methods, policies = set(registry.method_names()), set(registry.policy_names())
    yield
    for name in set(registry.method_names()) - methods:
        registry.unregister_method(name)
    for name in set(registry.policy_names()) - policies:
        registry.unregister_policy(name)


# ------------------------------------------------------------------ 1: a plugin gone since the run


@dataclass
class PullOptions(surecl.Options):
    lam: float = 0.1


class Pull(surecl.Method):
    name, Config = "r24_pull", PullOptions


def test_a_run_made_while_a_plugin_was_loaded_is_skipped_and_resumed_without_it(registered, tmp_path, tiny_cache, monkeypatch, capsys):
    """Every run's config.yaml holds every registered section; without the plugin a finished
    SeqLoRA run was "a different config" and an interrupted one could not resume."""
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    registered("r24_pull", Pull)
    cfg = build_config("tiny,seq_lora", SMALL)
    assert cfg.to_dict()["r24_pull"] == {"lam": 0.1}
    run(cfg, tmp_path / "done", progress=False, cache_dir=tiny_cache)
    stopped_at(monkeypatch, "step:1:0", lambda: run(cfg, tmp_path / "cut", progress=False, cache_dir=tiny_cache))
    own = build_config("tiny,r24_pull", SMALL).to_dict()  # a run of the plugin itself
    registry.unregister_method("r24_pull")

    argv = ["run", "--config", "tiny,seq_lora", "--quiet", *SMALL]
    assert main([*argv, "--out", str(tmp_path / "done")]) == 0
    assert "already finished (results.json); nothing to do" in capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "cut")]) == 0, capsys.readouterr().err
    assert (tmp_path / "cut" / "results.json").is_file()
    # a run of the missing plugin cannot be compared, nor run: a different config, never a traceback
    assert same_config(own, build_config("tiny,seq_lora", SMALL)) is False


def test_a_saved_config_yaml_reruns_without_a_plugin_it_did_not_use(registered, tmp_path, tiny_cache, monkeypatch, caplog):
    """``surecl run --config <run>/config.yaml`` of a SeqLoRA run made while a plugin was loaded
    was refused (its section was unknown); now the section is left out with a warning. A run of
    the plugin itself, and a user's own file with a misspelt section, are still refused."""
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    registered("r24_pull", Pull)
    saved = tmp_path / "config.yaml"
    saved.write_text(build_config("tiny,seq_lora", SMALL).to_yaml())
    own = tmp_path / "own.yaml"
    own.write_text(build_config("tiny,r24_pull", SMALL).to_yaml())
    registry.unregister_method("r24_pull")

    with caplog.at_level(logging.WARNING, logger="surecl"):
        cfg = build_config(str(saved), [])
    assert cfg.preset == "seq_lora" and "r24_pull" not in cfg.to_dict()
    assert "section r24_pull left out" in caplog.text
    assert cfg.to_dict() == build_config("tiny,seq_lora", SMALL).to_dict()
    with pytest.raises(SureclError, match="r24_pull"):
        build_config(str(own), [])
    typo = tmp_path / "typo.yaml"
    typo.write_text("method: seq_lora\nreplya: {ratio: '1:2'}\n")
    with pytest.raises(SureclError, match="replya"):
        build_config(str(typo), [])
    # an edited copy of a run's config.yaml: a section misspelt (nlora as nlroa) is refused, not
    # dropped as an absent plugin's (its values would be lost without a word)
    edited = tmp_path / "edited.yaml"
    edited.write_text(build_config("tiny,nlora", SMALL).to_yaml().replace("\nnlora:", "\nnlroa:"))
    with pytest.raises(SureclError, match="nlroa"):
        build_config(str(edited), [])
    # a file of the user's own holding every section but not written by a run keeps every key
    mine = tmp_path / "mine.yaml"
    mine.write_text(saved.read_text().split("\n", 1)[1])
    with pytest.raises(SureclError, match="r24_pull"):
        build_config(str(mine), [])


# ------------------------------------------------------------------ 2-4, 7, 11: refused at registration


class Plain(surecl.Method):
    pass


def test_a_method_named_like_a_packaged_preset_is_refused():
    """``--config surprise`` reads the preset: a method registered as "surprise" never ran."""
    for name in ("surprise", "random", "tiny"):
        with pytest.raises(ValueError, match=rf"^method '{name}': --config {name} and sweep --methods {name} run the packaged "
                                             rf"preset {name} \(surecl/presets/{name}.yaml\), not this method"):
            surecl.register_method(name, Plain)
        assert name not in registry.method_names()
    assert {"ewc", "seq_ft", "olora"} <= set(registry.method_names())  # a built-in's own preset selects it


@dataclass
class ExtremeOptions(surecl.Options):
    keep: str = "low"
    choices = {"keep": ("low", "high")}


class ExtremeByConfig(surecl.QuotaPolicy):
    name, Config = "r24_extreme", ExtremeOptions  # as a method declares its options
    uses_scores = True

    def priorities(self, task, n_items, scorer):
        sign = -1.0 if self.options.keep == "low" else 1.0
        return [sign * s for s in scorer(task)]


class Extreme(surecl.QuotaPolicy):
    name = "r24_extreme"
    uses_scores = True


def test_a_policy_whose_config_is_its_options_is_refused_with_the_way_to_give_them(registered):
    """The run built the policy's view of replay.* from its Config: AttributeError 'from_replay'."""
    with pytest.raises(TypeError, match=r"^replay policy 'r24_extreme': its Config ExtremeOptions is not a view of the replay "
                                        r"section .* register_policy\('r24_extreme', ExtremeByConfig, config=ExtremeOptions\)$"):
        surecl.register_policy("r24_extreme", ExtremeByConfig)
    assert "r24_extreme" not in registry.policy_names()
    registered("r24_extreme", Extreme, config=ExtremeOptions)  # the way the message gives
    assert build_config("tiny", ["replay.policy=r24_extreme", "r24_extreme.keep=high"]).r24_extreme.keep == "high"


@dataclass
class NoDefault(surecl.Options):
    lam: float


@dataclass
class BadDefault(surecl.Options):
    lam: float = -1.0

    def check(self, section):
        super().check(section)
        self.require(self.lam >= 0, f"{section}.lam", self.lam, "must be >= 0")


def _method(name: str, config=None, **attrs) -> type:
    return type("M", (surecl.Method,), {"name": name, **({"Config": config} if config else {}), **attrs})


def test_options_every_run_would_trip_over_are_refused_at_registration():
    """A section's defaults are built into every config: a field without a default was a
    traceback in every run of every method; a core key as section, one line in every run."""
    with pytest.raises(TypeError, match=r"^method 'r24_nodef': its options NoDefault\(\) cannot be built from their defaults "
                                        r"\(TypeError: .*missing 1 required positional argument: 'lam'\); give every option a default$"):
        surecl.register_method("r24_nodef", _method("r24_nodef", NoDefault))
    with pytest.raises(ValueError, match=r"^method 'r24_baddef': the defaults of its options BadDefault fail their own check: "
                                         r"SureclError: r24_baddef.lam: -1.0 must be >= 0$"):
        surecl.register_method("r24_baddef", _method("r24_baddef", BadDefault))
    for name, section in (("train", None), ("r24_core", "replay"), ("r24_opts", "options")):
        with pytest.raises(ValueError, match=rf"section '{section or name}' is a key of surecl's own config; register the options"):
            surecl.register_method(name, _method(name, PullOptions), section=section)
    assert not {"r24_nodef", "r24_baddef", "train", "r24_core", "r24_opts"} & set(registry.method_names())
    assert build_config("tiny,seq_lora").method == "sequential"  # every other run goes on
    assert set(registry.CORE_KEYS) == {f.name for f in dataclasses.fields(RunConfig)}


def test_an_installed_plugin_with_options_without_defaults_is_a_warning_and_other_runs_go_on(tmp_path, monkeypatch, fresh_registry, caplog):
    root = tmp_path / "site"
    info = root / "r24_pkg-0.1.dist-info"
    info.mkdir(parents=True)
    (root / "r24_nodefault_pkg.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        import surecl

        @dataclass
        class O(surecl.Options):
            lam: float

        class M(surecl.Method):
            name, Config = "r24_nodefault", O
    """), encoding="utf-8")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r24-pkg\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[surecl.methods]\nr24_nodefault = r24_nodefault_pkg:M\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(root))
    try:
        with caplog.at_level("WARNING", logger="surecl"):
            cfg = build_config("tiny,seq_lora")
    finally:
        sys.modules.pop("r24_nodefault_pkg", None)
    assert cfg.method == "sequential" and "r24_nodefault" not in registry.method_names()
    said = [r.getMessage() for r in caplog.records if r.name == "surecl" and r.levelno >= logging.WARNING]
    assert said == ["surecl: method 'r24_nodefault' from entry point r24_nodefault_pkg:M could not be loaded: method 'r24_nodefault': "
                    "its options O() cannot be built from their defaults (TypeError: O.__init__() missing 1 required positional "
                    "argument: 'lam'); give every option a default"], said


def test_a_declaration_out_of_range_is_refused_at_registration_not_after_the_model_loads(capsys, tmp_path, monkeypatch):
    with pytest.raises(TypeError, match=r"^method r24_typo: trains='Own' is not one of fast, base, own$"):
        surecl.register_method("r24_typo", _method("r24_typo", trains="Own"))
    with pytest.raises(TypeError, match=r"^method r24_unnamed: answers='slow' is not one of learner, own$"):
        surecl.register_method("r24_unnamed", type("U", (surecl.Method,), {"answers": "slow"}))  # named as registered
    assert not {"r24_typo", "r24_unnamed"} & set(registry.method_names())
    (tmp_path / "r24_typo_mod.py").write_text("import surecl\n\nclass M(surecl.Method):\n    name = 'r24_typo'\n    trains = 'Own'\n\n"
                                              "surecl.register_method('r24_typo', M)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert main(["--import", "r24_typo_mod", "run", "--config", "tiny,r24_typo", "--dry-run"]) == 2
    finally:
        sys.modules.pop("r24_typo_mod", None)
    assert capsys.readouterr().err == ("surecl: error: --import r24_typo_mod: TypeError: method r24_typo: trains='Own' is not one of "
                                       "fast, base, own\n")


class ForgotDataclass(surecl.Options):
    lam: float = 0.1


@dataclass
class Parent(surecl.Options):
    lam: float = 0.1


class Child(Parent):  # no fields of its own: nothing lost without @dataclass
    choices: ClassVar[dict] = {}


def test_options_without_their_own_dataclass_are_refused(registered):
    """``forgot_dc.lam=0.5`` was an unknown key and the method kept the class default."""
    with pytest.raises(TypeError, match=r"^method 'r24_forgot': config .*ForgotDataclass.* is not an @dataclass subclass of "
                                        r"surecl.options.Options$"):
        surecl.register_method("r24_forgot", _method("r24_forgot", ForgotDataclass))
    registered("r24_child", _method("r24_child", Child))
    assert build_config("tiny,r24_child", ["r24_child.lam=0.5"]).r24_child.lam == 0.5


# ------------------------------------------------------------------ 5: the dual learner


def test_the_dual_learner_is_refused_for_any_method_that_does_not_train_the_fast_adapter(registered):
    """A ``trains="base"`` plugin ran under the dual learner, its slow and fast rows the same bypassed adapters."""
    registered("r24_fullft", _method("r24_fullft", trains="base"))
    registered("r24_own", _method("r24_own", trains="own"))
    for name, trains in (("r24_fullft", "base"), ("r24_own", "own")):
        with pytest.raises(SureclError, match=rf"^dual.enabled: method {name} trains '{trains}' \(not the fast LoRA adapter\), so the "
                                              r"dual learner's slow adapter would average an adapter nothing trains; set dual.enabled=false$"):
            build_config("tiny,slow_surprise", [f"method={name}"])
        assert not build_config("tiny,slow_surprise", [f"method={name}", "dual.enabled=false"]).dual.enabled
    with pytest.raises(SureclError, match=r"^dual.enabled: seq_ft trains the base weights"):  # a built-in's own words first
        build_config("tiny,slow_surprise", ["method=seq_ft"])
    assert build_config("tiny,slow_surprise").dual.enabled  # the fast adapter's methods keep it


# ------------------------------------------------------------------ 6: hooks that return the wrong type


class Hooks(Plugin):
    name = "r24_hooks"

    def __init__(self, prefix=(), context=None):
        super().__init__()
        self.prefix, self.context = prefix, context

    def input_prefix(self, ctx, task):
        return self.prefix

    def eval_context(self, ctx, task):
        return self.context


def test_input_prefix_and_eval_context_returns_are_checked():
    for given, says in ((None, "None"), (5, r"a int \(5\)"), ("ab", r"a str \('ab'\)"), ([1, 2.5], r"a list \(\[1, 2.5\]\)")):
        with pytest.raises(SureclError, match=rf"^method plugin 'r24_hooks': its input_prefix hook returned {says} for task 1; expected "
                                              r"a sequence of integer token ids \(negative: virtual tokens\), \(\) for none$"):
            Plugins({"method": Hooks(prefix=given)}).input_prefix(None, 1)
    assert Plugins({"method": Hooks(prefix=[-1, -2]), "plugin:x": Hooks(prefix=(7,))}).input_prefix(None, 0) == (-1, -2, 7)
    with pytest.raises(SureclError, match=r"^method plugin 'r24_hooks': its eval_context hook returned None; expected a context "
                                          r"manager \(decorate the method with @contextlib.contextmanager and yield once\)$"):
        with Plugins({"method": Hooks(context=None)}).eval_context(None, 0):
            pass
    with Plugins({"method": Hooks(context=contextlib.nullcontext())}).eval_context(None, 0):
        pass


class OwnEmpty(surecl.Method):
    name, trains = "r24_own_empty", "own"

    def parameters(self, ctx):
        return []


class OwnFrozen(surecl.Method):
    name, trains = "r24_own_frozen", "own"

    def setup(self, ctx):
        self.p = torch.nn.Parameter(torch.zeros(3), requires_grad=False)

    def parameters(self, ctx):
        return [{"params": self.p, "lr": 0.1}]


def test_parameters_that_would_train_nothing_stop_the_build_in_one_line(registered, tmp_path, tiny_cache):
    """An empty list was the optimizer's ValueError; a frozen tensor backward's RuntimeError."""
    registered("r24_own_empty", OwnEmpty)
    registered("r24_own_frozen", OwnFrozen)
    want = r"expected the tensors it trains \(trains='own'\), at least one with requires_grad=True"
    for name, says in (("r24_own_empty", "returned no parameters"),
                       ("r24_own_frozen", r"returned 1 parameter\(s\), all frozen \(requires_grad=False\), so nothing would train")):
        cfg = build_config("tiny", [*SMALL, f"method={name}", "dual.enabled=false"])
        with pytest.raises(SureclError, match=rf"^method plugin '{name}': its parameters\(ctx\) {says}; {want}"):
            ContinualRun(cfg, tmp_path / name, progress=False, cache_dir=tiny_cache)
    from surecl.run_setup import trained_parameters

    p = torch.nn.Parameter(torch.zeros(2))
    assert trained_parameters(OwnEmpty(), (q for q in [p]), "x") == [p]  # a generator is listed
    assert trained_parameters(OwnEmpty(), [{"params": p, "lr": 0.1}], "x") == [{"params": [p], "lr": 0.1}]


class BaseNoEmbeddings(surecl.Method):
    """Full fine-tuning with the embeddings frozen in ``setup`` and the default ``parameters``
    (every base weight, the frozen one among them): ordinary PyTorch, and it must run."""

    name, trains = "r24_no_emb", "base"

    def setup(self, ctx):
        ctx.model.get_input_embeddings().weight.requires_grad_(False)


def test_a_frozen_tensor_beside_trained_ones_trains_the_others_and_keeps_itself(registered, tmp_path, tiny_cache):
    registered("r24_no_emb", BaseNoEmbeddings)
    cfg = build_config("tiny", [*SMALL, "method=r24_no_emb", "dual.enabled=false", "replay.policy=none", "model.dtype=fp32"])
    built = ContinualRun(cfg, tmp_path / "r", progress=False, cache_dir=tiny_cache)
    model = built.accelerator.unwrap_model(built.model)
    emb = model.get_input_embeddings().weight
    layer = next(p for n, p in model.named_parameters() if p.requires_grad and p.dim() == 2 and p is not emb)
    before_emb, before_layer = emb.detach().clone(), layer.detach().clone()
    built.run()
    assert torch.equal(emb, before_emb) and not torch.equal(layer, before_layer)


# ------------------------------------------------------------------ 8: --debug with --import


def test_debug_shows_the_traceback_of_a_module_that_fails_to_import(tmp_path, monkeypatch, capsys):
    (tmp_path / "r24_deep.py").write_text("def helper(x):\n    return x['missing']\n\n\nCONST = helper({})\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert main(["--import", "r24_deep", "list"]) == 2
        assert capsys.readouterr().err == "surecl: error: --import r24_deep: KeyError: 'missing'\n"
        for argv in (["--debug", "--import", "r24_deep", "list"], ["--import", "r24_deep", "list", "--debug"]):
            sys.modules.pop("r24_deep", None)
            with pytest.raises(SureclError, match="^--import r24_deep: KeyError") as err:
                main(argv)
            assert isinstance(err.value.__cause__, KeyError)  # the module's own traceback, under the one line
    finally:
        sys.modules.pop("r24_deep", None)


# ------------------------------------------------------------------ 9: tuples in a state's meta


class TupleState(Plugin):
    name = "r24_tuple"

    def state_dict(self):
        return {"last": [0, {"tasks": (0,)}]}, {}


def test_a_tuple_in_state_meta_is_said_once_as_json_reads_it_back_a_list(caplog):
    """Not refused: that would stop the run at its first checkpoint, its first task's work lost."""
    plugins = Plugins({"method": TupleState()})
    with caplog.at_level(logging.WARNING, logger="surecl"):
        meta, _ = plugins.state_dicts()["method"]
        plugins.state_dicts()
    said = [r.getMessage() for r in caplog.records]
    assert said == ["method plugin 'r24_tuple': its state_dict's meta holds a tuple at meta['last'][1]['tasks']; a resumed run's "
                    "load_state_dict gets it back as a list (JSON has no tuples): make it a tuple again there if it must be one"]
    assert json.loads(json.dumps(meta)) == {"last": [0, {"tasks": [0]}]}
    step = TrainStep(StepConfig(), [torch.nn.Parameter(torch.zeros(2))])  # AdamW's betas are a tuple
    meta, _ = Plugins({"optimizer": step}).state_dicts()["optimizer"]
    assert meta["param_groups"][0]["betas"] == [0.9, 0.999]
    step.load_state_dict(meta, {})
    assert list(step.optimizer.param_groups[0]["betas"]) == [0.9, 0.999]


# ------------------------------------------------------------------ 10: a policy's options in its __init__


@dataclass
class RecentOptions(surecl.Options):
    size_mode: str = "reservoir"
    choices = {"size_mode": ("reservoir", "quota")}


class Recent(surecl.ReplayPolicy):
    name = "r24_recent"
    online = True
    seen = None

    def __init__(self, cfg, capacity, seed):
        super().__init__(cfg, capacity, seed)
        type(self).seen = self.options
        if self.options.size_mode == "reservoir":
            self.buffer = ReservoirBuffer(capacity)


def test_a_policy_reads_its_options_in_its_init(registered, tmp_path, tiny_cache):
    registered("r24_recent", Recent, config=RecentOptions)
    for mode, buffer in (("reservoir", "ReservoirBuffer"), ("quota", "QuotaBuffer")):
        cfg = build_config("tiny,seq_lora", [*SMALL, "replay.policy=r24_recent", f"r24_recent.size_mode={mode}"])
        built = ContinualRun(cfg, tmp_path / mode, progress=False, cache_dir=tiny_cache)
        assert Recent.seen == RecentOptions(mode) and built.policy.options == RecentOptions(mode)
        assert type(built.policy.buffer).__name__ == buffer
    from surecl.run_setup import build_policy

    plain = build_policy(Extreme, None, ReplayConfig(), 4, 0)  # a policy that reads no options of its own
    assert plain.options is None and plain.capacity == 4 and plain.sample(1) == []


@dataclasses.dataclass
class QuotaRecentOptions(surecl.Options):
    size: int = 3


class QuotaRecent(surecl.QuotaPolicy):
    """A per-task quota policy (what SureTrainer takes) whose buffer size comes from an option."""

    name = "r24_quota"
    seen = None

    def __init__(self, cfg, capacity, seed):
        super().__init__(cfg, capacity, seed)
        type(self).seen = self.options.size


def test_suretrainers_policy_reads_its_options_in_its_init(registered, tmp_path, tiny_loaded):
    """SureTrainer builds its policy as a run does: the options are there in ``__init__``."""
    pytest.importorskip("datasets")
    from transformers import TrainingArguments

    from surecl.integrations.transformers import SureArguments, SureTrainer

    registered("r24_quota", QuotaRecent, config=QuotaRecentOptions)
    trainer = SureTrainer(model=copy.deepcopy(tiny_loaded.model), args=TrainingArguments(str(tmp_path), report_to=[], use_cpu=True),
                          sure=SureArguments(buffer_size=4, policy="r24_quota"))
    assert QuotaRecent.seen == 3 and trainer.policy.options == QuotaRecentOptions()
