"""Configuration: every preset builds and validates; overrides are typed; bad input is refused
with a one-line SureclError naming the key."""

from __future__ import annotations

import re

import pytest

from surecl.config import (
    DEFAULT_PRESET,
    META_KEYS,
    build_config,
    config_from_dict,
    get_key,
    load_yaml,
    preset_names,
    same_config,
    validate,
)
from surecl.errors import SureclError
from surecl.replay.policies import buffer_capacity

PRESETS = preset_names()
METHOD_PRESETS = [n for n in PRESETS if load_yaml(n)[0].get("kind", "method") == "method"]


def _leaves(mapping: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in mapping.items():
        if prefix == "" and k in META_KEYS:
            continue
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_preset_list_is_complete():
    assert {"tiny", "surprise", "slow_surprise", "reservoir", "random", "surprise_sa", "surprise_sbua"} <= set(PRESETS)
    assert DEFAULT_PRESET in METHOD_PRESETS
    assert "tiny" not in METHOD_PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_builds_and_applies_its_values(name):
    cfg = build_config(name)
    assert validate(cfg) is cfg
    for key, value in _leaves(load_yaml(name)[0]).items():
        assert get_key(cfg, key) == value, key
    assert cfg.preset == (name if name in METHOD_PRESETS else DEFAULT_PRESET)
    # a saved config rebuilds to the same tree
    assert config_from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()


@pytest.mark.parametrize("name", METHOD_PRESETS)
def test_every_method_preset_combines_with_tiny(name):
    cfg = build_config("tiny," + name)
    validate(cfg)
    method = _leaves(load_yaml(name)[0])
    tiny = _leaves(load_yaml("tiny")[0])
    for key, value in method.items():
        assert get_key(cfg, key) == value, key
    for key, value in tiny.items():
        if key not in method:
            assert get_key(cfg, key) == value, key
    assert cfg.model.name == "tiny" and cfg.data.benchmark == "tiny"
    assert cfg.preset == name


def test_setting_preset_alone_gets_the_default_method():
    cfg = build_config("tiny")
    default = _leaves(load_yaml(DEFAULT_PRESET)[0])
    for key, value in default.items():
        if key not in _leaves(load_yaml("tiny")[0]):
            assert get_key(cfg, key) == value, key
    assert cfg.replay.policy == "surprise" and cfg.dual.enabled is True


def test_overrides_are_typed():
    cfg = build_config(
        "tiny,surprise",
        [
            "replay.buffer_size=300",
            "dual.beta=0.99",
            "replay.every=3",
            "replay.aging=true",
            "lora.target_modules=q_proj,v_proj",
            "train.lr=1e-4",
        ],
    )
    assert cfg.replay.buffer_size == 300 and isinstance(cfg.replay.buffer_size, int)  # a count stays a count
    assert cfg.dual.beta == 0.99 and isinstance(cfg.dual.beta, float)
    assert cfg.replay.every == 3 and isinstance(cfg.replay.every, int)
    assert cfg.replay.aging is True
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.train.lr == pytest.approx(1e-4) and isinstance(cfg.train.lr, float)
    assert buffer_capacity(cfg.replay, 10_000) == 300


def test_overrides_come_after_presets():
    cfg = build_config("tiny,surprise_sa", ["replay.score_time=before"])
    assert cfg.replay.score_time == "before" and cfg.replay.insert_time == "after"


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["replay.bogus=1"], "replay.bogus"),
        (["nonsense=1"], "nonsense"),
        (["train.lr=abc"], "train.lr"),
        (["replay.every=2.5"], "replay.every"),
        (["replay.aging=maybe"], "replay.aging"),
        (["dual.beta=1.5"], "dual.beta"),
        (["dual.beta=0"], "dual.beta"),
        (["replay.buffer_size=-1"], "replay.buffer_size"),
        (["replay.buffer_size=2.5"], "replay.buffer_size"),
        (["replay.buffer_size=1.0"], "replay.buffer_size"),  # once silently one example
        (["replay.buffer_size=300.0"], "replay.buffer_size"),
        (["replay.buffer_fraction=1.5"], "replay.buffer_fraction"),
        (["replay.ratio=2"], "replay.ratio"),
        (["replay.ratio=1:0"], "replay.ratio"),
        (["replay.loss=mean"], "replay.loss"),
        (["dual.unit=token"], "dual.unit"),
        (["olora.per_task=[MNLI:0.5]"], "olora.per_task"),
        (["train.epochs_per_task=[MNLI:1.5]"], "train.epochs_per_task"),
        (["replay.every=0"], "replay.every"),
        (["replay.policy=fancy"], "replay.policy"),
        (["replay.score_time=after", "replay.insert_time=before"], "replay.insert_time"),
        (["replay.policy=random", "replay.aging=true"], "replay.aging"),
        (["train.lr"], "train.lr"),
    ],
)
def test_bad_overrides_raise_naming_the_key(overrides, key):
    with pytest.raises(SureclError, match=re.escape(key)) as info:
        build_config("tiny,surprise", overrides)
    assert "\n" not in str(info.value)


def test_score_after_insert_before_is_refused_even_from_a_preset_combination():
    with pytest.raises(SureclError, match="score_time"):
        build_config("tiny,surprise_sa", ["replay.insert_time=before"])


def test_unknown_preset():
    with pytest.raises(SureclError, match="no_such_preset") as info:
        build_config("tiny,no_such_preset")
    assert "\n" not in str(info.value)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(SureclError, match="does not exist"):
        build_config(str(tmp_path / "absent.yaml"))


def test_yaml_file_with_unknown_key_names_it(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("kind: method\nreplay: {policy: surprise, frobnicate: 2}\n", encoding="utf-8")
    with pytest.raises(SureclError, match=re.escape("replay.frobnicate")):
        build_config(f"tiny,{path}")


def test_dual_beta_takes_a_number_or_auto():
    cfg = build_config("tiny", ["dual.beta=auto"])
    assert cfg.dual.beta == "auto" and cfg.dual.window_tasks == 0.5
    assert build_config("tiny", ["dual.beta=0.99"]).dual.beta == 0.99
    for bad, words in ((["dual.beta=often"], "number in (0, 1) or auto"), (["dual.beta=auto", "dual.window_tasks=0"], "with dual.beta=auto"),
                        (["dual.beta=true"], "expected a float or a str, got True")):
        with pytest.raises(SureclError) as err:
            build_config("tiny", bad)
        assert words in str(err.value)
    # round trip through a saved config keeps the word
    assert config_from_dict(build_config("tiny", ["dual.beta=auto"]).to_dict()).dual.beta == "auto"


def test_same_config_ignores_dual_options_a_run_does_not_read():
    base = build_config("tiny,seq_lora")
    saved = base.to_dict()
    assert same_config(saved, build_config("tiny,seq_lora", ["dual.beta=auto", "dual.window_tasks=2"]))
    dual = build_config("tiny,slow_surprise", ["dual.beta=0.99"])
    assert same_config(dual.to_dict(), build_config("tiny,slow_surprise", ["dual.beta=0.99", "dual.window_tasks=3"]))
    assert not same_config(dual.to_dict(), build_config("tiny,slow_surprise", ["dual.beta=0.995"]))
    auto = build_config("tiny,slow_surprise", ["dual.beta=auto"])
    assert not same_config(auto.to_dict(), build_config("tiny,slow_surprise", ["dual.beta=auto", "dual.window_tasks=2"]))
    assert not same_config(auto.to_dict(), dual)


def test_buffer_fraction_and_counts_are_never_confused():
    """``replay.buffer_fraction=1.0`` is a capacity of every example; a count is written without a point;
    a config saved with the count as ``300.0`` (before the check) still reads as the count."""
    from surecl.config import config_from_dict

    cfg = build_config("tiny,surprise", ["replay.buffer_fraction=1.0"])
    assert buffer_capacity(cfg.replay, 384) == 384
    cfg = build_config("tiny,surprise", ["replay.buffer_size=1"])
    assert buffer_capacity(cfg.replay, 384) == 1
    assert "buffer_size: 1\n" in cfg.to_yaml()
    saved = build_config("tiny,surprise").to_dict()
    saved["replay"]["buffer_size"] = 300.0
    assert buffer_capacity(config_from_dict(saved).replay, 10_000) == 300
    with pytest.raises(SureclError, match="buffer_fraction"):
        build_config("tiny,surprise", ["replay.buffer_size=1.0"])
    # from Python too: a float at or above 1 was one example (1.0) or a count (300.0), silently
    from surecl.config import RunConfig, validate
    from surecl.sections import ReplayConfig

    for value in (1.0, 300.0):
        cfg = build_config("tiny,surprise")
        cfg.replay.buffer_size = value
        with pytest.raises(SureclError, match=r"buffer_size: .* is ambiguous.*buffer_fraction") as err:
            validate(cfg)
        assert "\n" not in str(err.value)
    with pytest.raises(SureclError, match="ambiguous"):
        RunConfig(replay=ReplayConfig(policy="surprise", buffer_size=1.0))
    cfg.replay.buffer_size = 300
    validate(cfg)


def test_dry_run_names_the_buffer_fraction_it_uses(capsys):
    """--dry-run's buffer line says the fraction S came from (replay.buffer_fraction when set,
    not the preset's buffer_size beside it)."""
    from surecl.cli import main

    assert main(["run", "--dry-run", "--config", "tiny,surprise", "replay.buffer_fraction=0.5"]) == 0
    out = capsys.readouterr().out
    assert "buffer: S = 192 (0.5 of 384)" in out


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("kind: banana\n", "kind: 'banana' is not one of method, setting"),
        ("essential: 3\n", "essential: expected a list"),
        ("essential: [nosuch.key]\n", "essential: 'nosuch.key' is not a config key"),
        ("orders: 3\n", "orders: expected a list"),
    ],
)
def test_a_presets_own_keys_are_checked(tmp_path, text, words):
    """A user's YAML preset: its kind, essential keys and orders (a traceback, or a kind taken
    for a setting without a word)."""
    f = tmp_path / "mine.yaml"
    f.write_text(text)
    with pytest.raises(SureclError, match=words):
        build_config(f"tiny,{f}")
