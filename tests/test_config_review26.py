"""Review 26: a YAML key given twice is refused (config files, plans, overrides), YAML merge keys
still override; build_config's argument types are one-line errors; a sweep checks a one-order
stream's task lists before it writes sweep.json; a plan's config and order names are checked."""

from __future__ import annotations

import glob
from importlib import resources
from pathlib import Path

import pytest

from surecl.cli import main
from surecl.config import build_config, preset_names, safe_yaml
from surecl.data.loading import check_order
from surecl.errors import SureclError
from surecl.sweep import load_plan, plan_names

ROOT = Path(__file__).resolve().parents[1]


# 1. a key given twice


def test_a_config_file_giving_a_section_twice_is_refused_naming_both_lines(tmp_path, capsys):
    f = tmp_path / "dup.yaml"
    f.write_text("train:\n  lr: 0.5\n  epochs: 3\nreplay:\n  buffer_size: 4\ntrain:\n  batch_size: 4\n")
    with pytest.raises(SureclError, match=r"dup\.yaml: key 'train' is given twice at the top level \(lines 1 and 6\)"):
        build_config(f"tiny,seq_lora,{f}")
    assert main(["run", "--config", f"tiny,seq_lora,{f}", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'train' is given twice" in err[0] and "Traceback" not in err[0]


@pytest.mark.parametrize("text, words", [
    ("train:\n  lr: 0.1\n  lr: 0.2\n", "key 'lr' is given twice in train (lines 2 and 3)"),
    ("data: {tasks: [a], tasks: [b]}\n", "key 'tasks' is given twice in data (line 1, twice)"),
    ("x: {1: a, 01: b}\n", "key '01' is given twice in x"),  # one key as YAML reads it
    ("seed: 1\n'seed': 2\n", "key 'seed' is given twice at the top level (lines 1 and 2)"),
    ("groups:\n  - {methods: [a]}\n  - {methods: [a], seeds: [0], seeds: [1]}\n", "key 'seeds' is given twice in groups[1] (line 3, twice)"),
    ("x: {y: &a {q: 1, q: 2}}\nz: *a\n", "key 'q' is given twice in x.y"),  # named where the anchor is written
    ("a: &a {x: 1}\nc:\n  <<: *a\n  y: 1\n  y: 2\n", "key 'y' is given twice in c (lines 4 and 5)"),
])
def test_a_key_given_twice_anywhere_names_its_path_and_lines(text, words):
    with pytest.raises(SureclError) as exc:
        safe_yaml(text, "f.yaml")
    assert str(exc.value).startswith("f.yaml: " + words) and "\n" not in str(exc.value)


def test_yaml_merge_keys_still_override(tmp_path):
    assert safe_yaml("a: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 2\n", "f") == {"a": {"x": 1, "y": 2}, "c": {"x": 2, "y": 2}}
    assert safe_yaml("a: &a {x: 1}\nb: &b {y: 2}\nc:\n  <<: *a\n  <<: *b\n", "f")["c"] == {"x": 1, "y": 2}
    # a merged mapping that merged another is not counted twice where it is merged again
    assert safe_yaml("a: &b {x: 1}\nm: &m\n  <<: *b\n  x: 2\n<<: *m\nz: 1\n", "f") == {"x": 2, "a": {"x": 1}, "m": {"x": 2}, "z": 1}
    f = tmp_path / "merge.yaml"
    f.write_text("train:\n  <<: {lr: 0.25, epochs: 2}\n  epochs: 3\n")
    cfg = build_config(f"tiny,seq_lora,{f}")
    assert cfg.train.lr == 0.25 and cfg.train.epochs == 3
    plan = tmp_path / "plan.yaml"
    plan.write_text("config: tiny\ngroups:\n  - &g {methods: [seq_lora], seeds: [0, 1]}\n  - <<: *g\n    methods: [reservoir]\n")
    assert load_plan(str(plan)).groups[1] == {"methods": ["reservoir"], "seeds": [0, 1]}


def test_a_plan_giving_seeds_twice_is_refused(tmp_path, capsys):
    f = tmp_path / "plan.yaml"
    f.write_text("config: tiny\nmethods: [seq_lora]\nseeds: [0,1,2]\nseeds: [5]\n")
    with pytest.raises(SureclError, match=r"key 'seeds' is given twice at the top level \(lines 3 and 4\)"):
        load_plan(str(f))
    out = tmp_path / "out"
    assert main(["sweep", "--plan", str(f), "--out", str(out), "--quiet"]) == 2
    assert "key 'seeds' is given twice" in capsys.readouterr().err and not out.exists()


def test_an_override_giving_a_key_twice_is_refused():
    with pytest.raises(SureclError, match=r"override data.hf: key 'path' is given twice in \[0\]"):
        build_config("tiny", ["data.hf=[{path: a.csv, path: b.csv}]"])


def test_every_yaml_file_surecl_ships_or_commits_still_loads(tmp_path):
    files = [*resources.files("surecl").joinpath("presets").iterdir(), *resources.files("surecl").joinpath("plans").iterdir()]
    files = [f for f in files if f.name.endswith(".yaml")] + [Path(p) for p in glob.glob(str(ROOT / "studies" / "*.yaml"))]
    assert len(files) >= 40
    for f in files:
        assert isinstance(safe_yaml(f.read_text(encoding="utf-8"), f.name), dict)
    for name in preset_names():
        build_config(name)
    for name in plan_names():
        load_plan(name)
    # a run's saved config.yaml reads back
    cfg = build_config("tiny,slow_surprise", ["replay.buffer_size=20"])
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml(), encoding="utf-8")
    assert build_config(str(saved)).to_dict() == cfg.to_dict()


# 2. build_config's argument types


def test_build_config_takes_a_path_object_as_one_file(tmp_path):
    f = tmp_path / "my,file.yaml"  # one path, not split on its comma
    f.write_text("kind: setting\ntrain: {lr: 0.25}\n")
    assert build_config(f).train.lr == 0.25
    assert build_config("tiny,seq_lora", ("train.lr=0.1",)).train.lr == 0.1  # a tuple of overrides, as before


@pytest.mark.parametrize("config, overrides, words", [
    (["tiny", "seq_lora"], None, "config: expected text like 'tiny,seq_lora' or a path to a YAML file, not list"),
    (3, None, "config: expected text like 'tiny,seq_lora' or a path to a YAML file, not int"),
    (b"tiny", None, "not bytes"),
    ("tiny,seq_lora", "train.lr=0.1", 'overrides: pass a list of key.sub=value texts, e.g. ["train.lr=0.1"], not one text'),
    ("tiny,seq_lora", {"train.lr": 0.1}, "overrides: pass a list"),
    ("tiny", [3], 'overrides[0]: expected a key.sub=value text like "train.lr=0.1", not int'),
    ("tiny", ["seed=1", None], "overrides[1]: expected a key.sub=value text"),
    ("tiny", [b"train.lr=0.1"], "not bytes"),
])
def test_build_config_refuses_wrong_argument_types_in_one_line(config, overrides, words):
    with pytest.raises(SureclError) as exc:
        build_config(config, overrides)
    assert words in str(exc.value) and "\n" not in str(exc.value)


# 3. a one-order stream's task lists, before sweep.json


@pytest.mark.parametrize("tasks, words", [
    ("[nosuch]", "data.tasks: the tiny benchmark has no task nosuch (it has colors, animals, numbers, weather)"),
    ("[colors, colors]", "task named twice in the stream: colors"),
])
def test_a_sweep_refuses_a_tiny_task_list_before_it_writes_its_plan(tmp_path, capsys, tasks, words):
    f = tmp_path / "plan.yaml"
    f.write_text(f"config: tiny\nmethods: [seq_lora]\norders: {{s1: {tasks}}}\n")
    out = tmp_path / "out"
    assert main(["sweep", "--plan", str(f), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"surecl: error: sweep: run seq_lora/order-s1/seed0: {words}"]
    assert not out.exists()


@pytest.mark.parametrize("grid", [["a", "b"], ["b", "a"]])
def test_a_sweep_checks_every_runs_task_files_not_only_the_first_with_that_order(tmp_path, capsys, grid):
    """The check was made once per (benchmark, order, tasks): a grid over data.jsonl whose first
    value holds the order's task passed the second, which holds another, unchecked."""
    for folder, task in (("a", "mine"), ("b", "theirs")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{task}.jsonl").write_text('{"text": "a b", "label": "x"}\n{"text": "c", "label": "y"}\n')
    files = {"a": f"[{tmp_path / 'a' / 'mine.jsonl'}]", "b": f"[{tmp_path / 'b' / 'theirs.jsonl'}]"}
    f = tmp_path / "plan.yaml"
    f.write_text("config: tiny\nmethods: [seq_lora]\noverrides: [data.benchmark=none]\norders: {o1: [mine]}\n"
                 f"grid: {{data.jsonl: [{', '.join(repr(files[g]) for g in grid)}]}}\n")
    out = tmp_path / "out"
    assert main(["sweep", "--plan", str(f), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.jsonl / data.hf has no task mine (it has theirs)" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("overrides, words", [
    (["data.kind=generate", "data.tasks=[colors,nosuch]"], "the tiny benchmark has no task nosuch"),
    (["data.benchmark=embedded", "data.tasks=[newsgroups,nosuch]"], "the embedded benchmark has no task nosuch (it has newsgroups"),
    (["data.benchmark=embedded", "data.allow_missing=true", "data.tasks=[nosuch]"], "the embedded benchmark has no task nosuch"),
    (["data.benchmark=embedded", "data.tasks=[tweets,tweets]"], "task named twice in the stream: tweets"),
    (["data.benchmark=instruct", "data.kind=generate", "data.tasks=[qa,nosuch]"], "the instruct stream has no task nosuch"),
    (["data.jsonl=[{own}]", "data.tasks=[mine,nosuch]"], "the tiny benchmark or data.jsonl / data.hf has no task nosuch"),
    (["data.benchmark=none", "data.jsonl=[{own}]", "data.tasks=[colors]"], "data.jsonl / data.hf has no task colors (it has mine)"),
])
def test_one_order_streams_check_their_task_lists_before_loading(tmp_path, overrides, words):
    own = tmp_path / "mine.jsonl"
    own.write_text('{"text": "a b", "label": "x"}\n{"text": "c", "label": "y"}\n')
    cfg = build_config("tiny,seq_lora", [o.format(own=own) for o in overrides])
    with pytest.raises(SureclError) as exc:
        check_order(cfg.data, "give an order its task list", folder=True)
    assert words in str(exc.value)


@pytest.mark.parametrize("overrides", [
    ["data.tasks=[weather,colors]"],
    ["data.benchmark=embedded", "data.allow_missing=true", "data.tasks=[newsgroups,nosuch]"],  # the run leaves nosuch out
    ["data.benchmark=instruct", "data.kind=generate", "data.tasks=[sql,qa]"],
    ["data.jsonl=[{own}]", "data.tasks=[mine,colors]"],
    ["data.benchmark=none", "data.jsonl=[{own}]", "data.tasks=[mine]"],
])
def test_one_order_streams_pass_their_own_task_lists(tmp_path, overrides):
    own = tmp_path / "mine.jsonl"
    own.write_text('{"text": "a b", "label": "x"}\n{"text": "c", "label": "y"}\n')
    check_order(build_config("tiny,seq_lora", [o.format(own=own) for o in overrides]).data, "", folder=True)


# 4. a plan's config and order names


@pytest.mark.parametrize("text, words", [
    ("config: [tiny, seq_lora]\nmethods: [seq_lora]\n", "config: expected text like tiny,seq_lora"),
    ("config: {a: 1}\nmethods: [seq_lora]\n", "config: expected text like tiny,seq_lora"),
    ("config: []\nmethods: [seq_lora]\n", "config: expected text like tiny,seq_lora"),
    ("config: tiny\nmethods: [seq_lora]\norders: {null: [colors]}\n", "orders: order name None must be text or a number"),
    ("config: tiny\nmethods: [seq_lora]\norders: {yes: [colors]}\n", "orders: order name True must be text or a number"),
    ("description: [a]\nmethods: [seq_lora]\n", "description: expected text, not list"),
    ("methods: [seq_lora]\norder_benchmark: {null: LNT}\n", "order_benchmark: None: 'LNT' must map an order's name"),
    ("methods: [seq_lora]\norder_benchmark: {s1: [LNT]}\n", "order_benchmark: 's1': \\['LNT'\\] must map"),
    ("methods: [seq_lora]\norder_benchmark: {s1: }\n", "order_benchmark: 's1': None must map"),
])
def test_plan_config_and_order_names_are_checked(tmp_path, text, words):
    f = tmp_path / "plan.yaml"
    f.write_text(text)
    with pytest.raises(SureclError, match=words):
        load_plan(str(f))


def test_plan_order_names_as_numbers_or_quoted_words_stay(tmp_path):
    f = tmp_path / "plan.yaml"
    f.write_text("config:\nmethods: [seq_lora]\n")
    assert load_plan(str(f)).config == ""  # an empty config: as before
    f.write_text("config: tiny\nmethods: [seq_lora]\norders: {1.5: [colors], 'null': [animals], 010: [weather]}\n")
    assert list(load_plan(str(f)).orders) == ["1.5", "null", "010"]
    f.write_text("description: >-\n  two\n  lines\nmethods: [seq_lora]\norder_benchmark: {4: LNT, '4b': Standard CL}\n")
    plan = load_plan(str(f))
    assert (plan.description, plan.order_benchmark) == ("two lines", {"4": "LNT", "4b": "Standard CL"})


def test_a_raw_text_override_is_not_read_as_yaml():
    """``data.text_start`` (and ``replay.ratio``, ``preset``) are taken as written: a value that
    reads as a YAML mapping with a repeated key is their text, not a refused mapping."""
    assert build_config("tiny", ["data.text_start={a: 1, a: 2}"]).data.text_start == "{a: 1, a: 2}"
    assert build_config("tiny", ["preset={x: 1, x: 2}"]).preset == "{x: 1, x: 2}"


def test_a_section_valued_override_decides_an_essential_key(tmp_path):
    """The essential-key refusal says "set train.epochs on the command line"; written inside its
    section's mapping (train={epochs: 3}) the override was still refused."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("kind: setting\ntrain: {epochs: 7}\n")
    assert build_config(f"progressive_prompts,{mine}", ["train.epochs=3"]).train.epochs == 3
    assert build_config(f"progressive_prompts,{mine}", ["train={epochs: 3}"]).train.epochs == 3
    with pytest.raises(SureclError, match="sets train.epochs=7 over progressive_prompts's essential train.epochs=10"):
        build_config(f"progressive_prompts,{mine}", ["train={lr: 0.1}"])  # a section override of another key decides nothing
