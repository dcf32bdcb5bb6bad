"""A broken plugin is one line naming it, never a traceback: a lazy ``"module:Class"`` entry
that cannot be imported, has no ``:`` or names a class of the wrong kind; an installed package
whose module registers its own plugins (docs/extending.md's example packaged as the page says:
no false warning); and hook returns the run would otherwise trip over far from the plugin
(``loss``, ``sample_replay``, ``state_dict``, a quota policy's ``priorities``).

Entry points come from a real ``*.dist-info`` folder put on ``sys.path`` (what ``pip install``
leaves), read by a fresh registry; both registries are put back as they were after each test."""

from __future__ import annotations

import json
import logging
import math
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from extension_example import example_code

from surecl import registry
from surecl.cli import main
from surecl.config import build_config
from surecl.errors import SureclError
from surecl.methods.base import Method
from surecl.plugins.base import Plugin, Plugins
from surecl.replay.buffer import Entry
from surecl.replay.policies import QuotaPolicy
from surecl.trainer import ContinualRun

SMALL = ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=4", "train.epochs=1", "eval.before=false"]


@pytest.fixture
def install(tmp_path, monkeypatch, fresh_registry):
    """``install(modules, entry_points)``: the modules (name -> code) and a distribution declaring
    ``entry_points`` (entry_points.txt), on ``sys.path`` as an installed package; removed after."""
    names: list[str] = []

    def make(modules: dict[str, str], entry_points: str) -> Path:
        root = tmp_path / "site"
        root.mkdir()
        for name, code in modules.items():
            (root / f"{name}.py").write_text(code, encoding="utf-8")
            names.append(name)
        info = root / "surecl_plugin_pkg-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: surecl-plugin-pkg\nVersion: 0.1\n", encoding="utf-8")
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points), encoding="utf-8")
        monkeypatch.syspath_prepend(str(root))
        return root

    yield make
    for name in names:
        sys.modules.pop(name, None)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "surecl" and r.levelno >= logging.WARNING]


def one_error_line(capsys) -> str:
    """The CLI's stderr, which must end in one ``surecl: error:`` line and hold no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.rstrip("\n").split("\n")[-1]
    assert last.startswith("surecl: error: "), err
    return last[len("surecl: error: "):]


# ------------------------------------------------------------------ lazy "module:Class" entries

LAZY = """
import surecl

class Keep(surecl.QuotaPolicy):
    name = "keep"
    def priorities(self, task, n_items, scorer):
        return [float(i) for i in range(n_items)]

class NotAMethod:
    pass

GOOD = surecl.PolicySpec("lazy_good", "plugin_lazy:Keep")
MISSING = surecl.PolicySpec("lazy_missing", "plugin_lazy_absent:Policy")
NO_ATTR = surecl.PolicySpec("lazy_noattr", "plugin_lazy:Absent")
NO_COLON = surecl.PolicySpec("lazy_badstr", "plugin_lazy.Keep")
NOT_SUB = surecl.MethodSpec("lazy_notsub", "plugin_lazy:NotAMethod")
"""

LAZY_EPS = """
[surecl.methods]
lazy_notsub = plugin_lazy:NOT_SUB

[surecl.policies]
lazy_good = plugin_lazy:GOOD
lazy_missing = plugin_lazy:MISSING
lazy_noattr = plugin_lazy:NO_ATTR
lazy_badstr = plugin_lazy:NO_COLON
"""


def test_a_lazy_entry_that_cannot_be_imported_is_one_line_naming_it(install, capsys):
    install({"plugin_lazy": LAZY}, LAZY_EPS)
    assert registry.policy_class("lazy_good").__name__ == "Keep"  # the good one loads on first use
    with pytest.raises(SureclError) as err:
        registry.policy_class("lazy_missing")
    assert str(err.value) == ("replay policy 'lazy_missing': cannot import 'plugin_lazy_absent:Policy': "
                              "ModuleNotFoundError: No module named 'plugin_lazy_absent'")
    with pytest.raises(SureclError, match=r"^replay policy 'lazy_noattr': cannot import 'plugin_lazy:Absent': AttributeError: "):
        registry.policy_class("lazy_noattr")
    assert main(["run", "--config", "tiny", "--dry-run", "replay.policy=lazy_missing"]) == 2
    assert one_error_line(capsys).startswith("replay policy 'lazy_missing': cannot import 'plugin_lazy_absent:Policy'")


def test_a_lazy_class_of_the_wrong_kind_is_one_line(install, capsys):
    install({"plugin_lazy": LAZY}, LAZY_EPS)
    with pytest.raises(SureclError, match=r"^method 'lazy_notsub': <class 'plugin_lazy.NotAMethod'> is not a subclass of "
                                          r"surecl.methods.base.Method \(imported from 'plugin_lazy:NotAMethod'\)$"):
        registry.method_class("lazy_notsub")
    assert main(["run", "--config", "tiny", "--dry-run", "method=lazy_notsub"]) == 2
    assert one_error_line(capsys).startswith("method 'lazy_notsub': <class 'plugin_lazy.NotAMethod'> is not a subclass")


def test_a_lazy_string_without_a_colon_is_refused_when_registered(install, capsys, caplog):
    install({"plugin_lazy": LAZY}, LAZY_EPS)
    with caplog.at_level("WARNING", logger="surecl"):
        names = registry.policy_names()
    assert "lazy_badstr" not in names and {"lazy_good", "lazy_missing", "surprise"} <= set(names)  # the others go on
    said = [w for w in warnings_of(caplog) if "lazy_badstr" in w]
    assert said == ["surecl: replay policy 'lazy_badstr' from entry point plugin_lazy:NO_COLON could not be loaded: replay policy "
                    "'lazy_badstr': class 'plugin_lazy.Keep' is not a \"module:Class\" import path (a module's dotted name, ':', "
                    "then the class's name, e.g. \"my_cl.policies:Extreme\")"]
    assert main(["run", "--config", "tiny", "--dry-run", "replay.policy=lazy_badstr"]) == 2
    assert "'lazy_badstr' is not one of" in one_error_line(capsys)
    for bad in ("plugin_lazy.Keep", "plugin_lazy:", ":Keep", "plugin lazy:Keep", "plugin_lazy:Keep:X"):
        with pytest.raises(ValueError, match="is not a \"module:Class\" import path"):
            registry._POLICIES.add(registry.PolicySpec("lazy_x", bad), replace=False)
    with pytest.raises(TypeError, match="is neither a class nor"):
        registry._POLICIES.add(registry.PolicySpec("lazy_x", 42), replace=False)
    registry._POLICIES.add(registry.PolicySpec("lazy_x", "plugin_lazy:Keep"), replace=False)  # the right form passes
    assert registry.policy_class("lazy_x").__name__ == "Keep"


# ------------------------------------------------------------------ a package registering its own plugins

PACKAGED_EPS = """
[surecl.methods]
l2_prev = {module}:L2Prev

[surecl.policies]
extreme = {module}:EXTREME
"""


def test_the_documented_package_loads_without_a_false_warning(install, caplog):
    """docs/extending.md's module installed with the page's entry points: loading ``l2_prev``
    imports it, and its own ``register_policy`` call must not read ``EXTREME`` half-imported."""
    install({"plugin_doc": example_code()}, PACKAGED_EPS.format(module="plugin_doc"))
    with caplog.at_level("WARNING", logger="surecl"):
        assert "l2_prev" in registry.method_names()  # the method table first: the order that warned
        assert "extreme" in registry.policy_names()
        cfg = build_config("tiny,l2_prev", ["l2_prev.lam=0.5", "replay.policy=extreme", "extreme.keep=high"])
    assert warnings_of(caplog) == []
    module = sys.modules["plugin_doc"]
    assert registry.policy_class("extreme") is module.ExtremeSurprise and registry.method_class("l2_prev") is module.L2Prev
    assert (cfg.l2_prev.lam, cfg.extreme.keep) == (0.5, "high")


def test_the_package_imported_with_import_too_gives_no_warning(install, caplog):
    """The same package, also given to ``--import``: its top-level ``register_method`` loads the
    entry points while the module is half imported; ``extreme`` is settled once it is complete."""
    install({"plugin_doc": example_code()}, PACKAGED_EPS.format(module="plugin_doc"))
    with caplog.at_level("WARNING", logger="surecl"):
        registry.import_modules(["plugin_doc"])
        names = registry.policy_names()
    assert warnings_of(caplog) == [] and "extreme" in names
    assert registry.policy_class("extreme") is sys.modules["plugin_doc"].ExtremeSurprise


ONLY_SPEC = """
import surecl

class L2(surecl.Method):
    name = "l2_only"

class Other(surecl.QuotaPolicy):
    name = "other_only"
    def priorities(self, task, n_items, scorer):
        return [1.0] * n_items

surecl.register_method("l2_only", L2)
surecl.register_policy("other_only", Other)  # loads the registries while EXTREME is not yet there

class Extreme(surecl.QuotaPolicy):
    name = "extreme_only"
    def priorities(self, task, n_items, scorer):
        return [0.0] * n_items

EXTREME = surecl.PolicySpec("extreme_only", Extreme)  # no register_policy: the entry point alone declares it
"""


def test_an_entry_point_read_half_imported_is_loaded_once_its_module_is_complete(install, caplog):
    install({"plugin_only": ONLY_SPEC}, "[surecl.methods]\nl2_only = plugin_only:L2\n[surecl.policies]\nextreme_only = plugin_only:EXTREME\n")
    with caplog.at_level("WARNING", logger="surecl"):
        registry.import_modules(["plugin_only"])
        names = registry.policy_names()
    assert warnings_of(caplog) == []
    assert {"extreme_only", "other_only"} <= set(names)
    assert registry.policy_class("extreme_only") is sys.modules["plugin_only"].Extreme


def test_a_broken_entry_point_is_still_warned_about_once_and_others_go_on(install, caplog):
    install({"plugin_doc": example_code()},
            PACKAGED_EPS.format(module="plugin_doc") + "\n[surecl.methods]\nbroken = plugin_nowhere:X\n")
    with caplog.at_level("WARNING", logger="surecl"):
        methods = registry.method_names()
        registry.policy_names()
        registry.method_names()
    assert warnings_of(caplog) == ["surecl: method 'broken' from entry point plugin_nowhere:X could not be loaded: "
                                   "No module named 'plugin_nowhere'"]
    assert "l2_prev" in methods and "broken" not in methods


# ------------------------------------------------------------------ hook returns, at the dispatcher


class Returns(Plugin):
    """A plugin whose hooks return what it is told to."""

    name = "returns"

    def __init__(self, loss=None, entries=None, state=None):
        super().__init__()
        self.loss_value, self.entries, self.state = loss, entries, state

    def loss(self, ctx, loss):
        return self.loss_value(loss)

    def sample_replay(self, ctx, stage, step, count):
        return self.entries

    def state_dict(self):
        return self.state


def test_a_loss_hook_must_return_the_loss_tensor():
    given = torch.tensor(2.0, requires_grad=True)
    ok = Plugins({"method": Returns(loss=lambda loss: loss + 1.0)})
    assert ok.loss(None, given).item() == 3.0
    cases = [
        (lambda loss: None, "returned None"),
        (lambda loss: 2.0, r"returned a float \(2.0\)"),
        (lambda loss: loss.expand(2), r"returned a Tensor of shape \(2,\)"),
        (lambda loss: loss.detach(), r"returned a Tensor of shape \(\) cut from the autograd graph"),
    ]
    for hook, says in cases:
        with pytest.raises(SureclError, match=rf"^method plugin 'returns': its loss hook {says}.*; expected the loss tensor it was given") as err:
            Plugins({"method": Returns(loss=hook)}).loss(None, given)
        assert "\n" not in str(err.value)
    with pytest.raises(SureclError, match=r"^plugin 'returns': its loss hook returned None"):  # an extra plugin, named as one
        Plugins({"plugin:returns": Returns(loss=lambda loss: None)}).loss(None, given)
    assert Plugins({"method": Returns(loss=lambda loss: loss.detach())}).loss(None, given.detach()).item() == 2.0  # none was asked


def test_sample_replay_must_answer_entries_of_existing_examples():
    ctx = SimpleNamespace(train_sets=[[None] * 4, [None] * 3])
    expected = "expected None or a list of surecl.replay.buffer.Entry"
    cases = [
        ([(0, 1)], r"returned a tuple \(\(0, 1\)\) as entry 0"),
        (Entry(0, 1), r"returned a Entry \(Entry\(task=0, index=1, score=0.0\)\)"),
        ([Entry(0, 1), Entry(2, 0)], "returned entry 1 for task 2 example 0, which does not exist"),
        ([Entry(1, 3)], "returned entry 0 for task 1 example 3, which does not exist"),
        ([Entry(0, -1)], "returned entry 0 for task 0 example -1, which does not exist"),
    ]
    for entries, says in cases:
        with pytest.raises(SureclError, match=rf"^method plugin 'returns': its sample_replay hook {says}.*{expected}"):
            Plugins({"method": Returns(entries=entries)}).sample_replay(ctx, None, 0, 1)
    good = [Entry(0, 3), Entry(1, 2)]
    assert Plugins({"method": Returns(entries=good)}).sample_replay(ctx, None, 0, 2) == good
    assert Plugins({"method": Returns(entries=None), "replay": Returns(entries=(Entry(1, 0),))}).sample_replay(ctx, None, 0, 1) == [Entry(1, 0)]


def test_state_dict_must_be_what_a_checkpoint_holds():
    cases = [
        (({}, {"x": 1.5}), r"its state_dict's tensors hold a float \(1.5\) under 'x'"),
        (({}, {3: torch.zeros(1)}), r"its state_dict's tensors hold a Tensor of shape \(1,\) under 3"),
        (({"t": torch.zeros(2)}, {}), "its state_dict's meta is not JSON-serialisable \\(Object of type Tensor is not JSON serializable\\)"),
        (({"s": float("nan")}, {}), "its state_dict's meta is not JSON-serialisable \\(Out of range float values are not JSON compliant"),
        ((torch.zeros(1),), r"its state_dict returned a tuple \(\(tensor\(\[0.\]\),\)\)"),
        (({}, {}, {}), r"its state_dict returned a tuple \(\(\{\}, \{\}, \{\}\)\)"),
        (None, "its state_dict returned None"),
    ]
    for state, says in cases:
        with pytest.raises(SureclError, match=rf"^replay plugin 'returns': {says}.*expected \(meta, tensors\)"):
            Plugins({"replay": Returns(state=state)}).state_dicts()
    good = ({"n": 1, "pending": [0.5]}, {"w": torch.zeros(2)})
    assert Plugins({"method": Returns(state=good)}).state_dicts() == {"method": good}
    assert Plugins({"method": Returns(state=[{}, {}])}).state_dicts() == {"method": ({}, {})}  # a list pair reads the same


class Told(QuotaPolicy):
    name = "told"
    told = None

    def priorities(self, task, n_items, scorer):
        return self.told(n_items)


def test_quota_priorities_must_be_one_finite_number_per_item():
    replay = build_config("tiny").replay

    def policy(told):
        made = Told(replay, 4, 0)
        made.told = told
        return made

    expected = "expected a list of 5 finite numbers, one per training example of task 0, in order"
    cases = [
        (lambda n: [float("nan")] * n, r"returned nan for example 0 \(and 4 more non-finite\)"),
        (lambda n: [0.0, 1.0, math.inf, 0.0, 0.0], "returned inf for example 2"),
        (lambda n: [1.0] * (n - 3), "returned 2 values"),
        (lambda n: [1.0] * (n + 1), "returned 6 values"),
        (lambda n: None, r"returned a NoneType \(None\)"),
        (lambda n: ["1.0"] * n, r"returned a list \(\['1.0'"),
    ]
    for told, says in cases:
        bad = policy(told)
        with pytest.raises(SureclError, match=rf"^replay policy 'told': priorities\(task=0, n_items=5\) {says}.*; {expected}$"):
            bad.at_task_start(0, 5, None)  # where the run asks (score time "before"): before the task trains
        assert bad._pending is None and len(bad.buffer) == 0
    fine = policy(lambda n: [torch.tensor(2.0)] + list(range(1, n)))  # numbers of any kind read as floats
    fine.at_task_start(0, 5, None)
    assert sorted((e.score, e.index) for e in fine.buffer.entries) == [(2.0, 0), (2.0, 2), (3.0, 3), (4.0, 4)]
    assert all(type(e.score) is float for e in fine.buffer.entries)
    json.dumps(fine.state_dict()[0], allow_nan=False)  # what a checkpoint writes


# ------------------------------------------------------------------ hook returns, in a run


class LossNone(Method):
    name = "b_lossnone"

    def loss(self, ctx, loss):
        return None


class TupleReplay(Method):
    name = "b_badsample"

    def sample_replay(self, ctx, stage, step, count):
        return [(0, 1)] * count if count else None


class FloatState(Plugin):
    name = "float_state"

    def state_dict(self):
        return {}, {"x": 1.5}


class NanPriorities(QuotaPolicy):
    name = "b_nanprio"

    def priorities(self, task, n_items, scorer):
        return [float("nan")] * n_items


@pytest.fixture
def broken_registered():
    registry.register_method("b_lossnone", LossNone)
    registry.register_method("b_badsample", TupleReplay)
    registry.register_policy("b_nanprio", NanPriorities)
    yield
    registry.unregister_method("b_lossnone")
    registry.unregister_method("b_badsample")
    registry.unregister_policy("b_nanprio")


def run_of(tmp_path, tiny_cache, overrides, plugins=()):
    cfg = build_config("tiny", [*SMALL, *overrides])
    return ContinualRun(cfg, tmp_path / "run", progress=False, cache_dir=tiny_cache, plugins=list(plugins))


def test_broken_hook_returns_stop_a_run_in_one_line_naming_the_plugin(broken_registered, tmp_path, tiny_cache):
    with pytest.raises(SureclError, match=r"^method plugin 'b_lossnone': its loss hook returned None; expected"):
        run_of(tmp_path / "loss", tiny_cache, ["method=b_lossnone"]).run()
    with pytest.raises(SureclError, match=r"^method plugin 'b_badsample': its sample_replay hook returned a tuple \(\(0, 1\)\) as entry 0"):
        run_of(tmp_path / "sample", tiny_cache, ["method=b_badsample", "replay.policy=reservoir", "replay.every=1"]).run()
    run = run_of(tmp_path / "state", tiny_cache, [], [FloatState()])
    with pytest.raises(SureclError, match=r"^plugin 'float_state': its state_dict's tensors hold a float \(1.5\) under 'x'"):
        run.run()
    assert not list((tmp_path / "state" / "run" / "checkpoints").glob("stage-*"))  # nothing half written
    run = run_of(tmp_path / "prio", tiny_cache, ["replay.policy=b_nanprio"])
    with pytest.raises(SureclError, match=r"^replay policy 'b_nanprio': priorities\(task=0, n_items=8\) returned nan for example 0"):
        run.run()
    assert run.state.global_step == 0  # refused before the task trained (score time "before"), not at the checkpoint


def test_the_cli_prints_a_broken_hook_as_one_line(tmp_path, tiny_cache, capsys, monkeypatch):
    (tmp_path / "plugin_broken_cli.py").write_text(textwrap.dedent("""
        import surecl

        class LossFloat(surecl.Method):
            name = "b_lossfloat"
            def loss(self, ctx, loss):
                return 2.5

        surecl.register_method("b_lossfloat", LossFloat)
    """), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    try:
        code = main(["--import", "plugin_broken_cli", "run", "--config", "tiny", "--quiet", "--out", str(tmp_path / "out"),
                     "method=b_lossfloat", *SMALL])
    finally:
        registry.unregister_method("b_lossfloat")
        sys.modules.pop("plugin_broken_cli", None)
    assert code == 2
    assert one_error_line(capsys) == ("method plugin 'b_lossfloat': its loss hook returned a float (2.5); expected the loss tensor "
                                      "it was given (one element, in the autograd graph), with any penalty added (loss + penalty)")
    assert not (tmp_path / "out" / "results.json").exists()


class Loads(Plugin):
    """A plugin whose load_state_dict cannot read what an earlier version of it wrote."""

    name = "loads"

    def load_state_dict(self, meta, tensors):
        raise KeyError("weights_v2")


def test_a_plugin_that_cannot_read_its_checkpointed_state_is_one_line_naming_it():
    with pytest.raises(SureclError, match=r"^plugin 'loads': its load_state_dict could not read the checkpoint's state: "
                                          r"KeyError: 'weights_v2' \(a checkpoint another version") as err:
        Plugins({"plugin:loads": Loads()}).load_state_dicts({"plugin:loads": ({"v": 1}, {})})
    assert "\n" not in str(err.value) and isinstance(err.value.__cause__, KeyError)  # --debug shows the plugin's traceback


def test_running_out_of_memory_while_loading_state_is_not_called_an_unreadable_checkpoint():
    """An out-of-memory error (moving the optimizer state onto the device, say) passes through
    unchanged: the command line's handler says the checkpoint is intact and a rerun resumes."""

    class Big(Loads):
        def load_state_dict(self, meta, tensors):
            raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        Plugins({"optimizer": Big()}).load_state_dicts({})
