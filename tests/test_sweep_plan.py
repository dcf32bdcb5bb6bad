"""Sweep plans: the packaged paper plans and a study file expand to the runs they name, the
command line replaces a plan's values, and bad plans are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surecl.cli import _preset_orders, main
from surecl.config import build_config, same_config
from surecl.errors import SureclError
from surecl.sweep import expand, load_plan, plan_names


def test_packaged_plans_reproduce_the_papers_tables():
    assert {"paper-standard", "paper-lnt", "ablation-buffer", "ablation-ratio", "ablation-beta"} <= set(plan_names())
    lnt = load_plan("paper-lnt")
    runs = expand(lnt)
    assert len(runs) == 8 * 3 * 3 and {r.order for r in runs} == {"4", "5", "6"} and {r.seed for r in runs} == {0, 1, 2}
    ratio = expand(load_plan("ablation-ratio"))
    assert {r.row for r in ratio if r.method == "slow_surprise_sa"} == {f"slow_surprise_sa replay.ratio=1:{k}" for k in (2, 4, 8, 16)}
    cfg = build_config(f"{load_plan('ablation-ratio').config},slow_surprise_sa", ratio[0].overrides)
    assert cfg.replay.buffer_size == 300 and cfg.data.n_train == 1000 and cfg.replay.ratio == "1:2" and cfg.replay.loss == "example"
    assert cfg.data.draw == "run"  # every packaged study makes each (order, seed) run independent: data and random streams
    beta = expand(load_plan("ablation-beta"))
    assert {r.row.split(" ")[1] for r in beta} == {f"dual.beta={b}" for b in ("0.985", "0.99", "0.995", "0.999")}
    cfg = build_config("paper-t5,lnt,slow_surprise", beta[0].overrides)
    assert cfg.replay.ratio == "1:2" and cfg.dual.unit == "example" and not cfg.dual.bias_correction
    for name in ("paper-standard", "paper-lnt", "ablation-buffer", "ablation-beta"):
        assert "data.draw=run" in expand(load_plan(name))[0].overrides
    # the buffer-size table's caption says 1:4 (its 300 row is the ratio table's 1:4 row); the beta table's 1:2
    buffer = expand(load_plan("ablation-buffer"))
    cfg = build_config("paper-t5,lnt,slow_surprise_sa", buffer[0].overrides)
    assert cfg.replay.ratio == "1:4" and cfg.replay.buffer_size == 150


def test_plan_with_named_orders_and_groups(tmp_path):
    f = tmp_path / "study.yaml"
    f.write_text(
        "description: a study\n"
        "overrides: [data.n_train=8]\n"
        "orders: {a: [colors, animals], b: [animals, colors]}\n"
        "order_benchmark: {a: Standard CL}\n"
        "groups:\n"
        "  - {methods: [seq_lora], seeds: [0, 1]}\n"
        "  - {methods: [reservoir], seeds: [0], orders: [b], grid: {replay.every: [1, 2]}, overrides: [data.n_test=4]}\n"
    )
    runs = expand(load_plan(str(f)))
    assert [(r.row, r.order, r.seed) for r in runs] == [
        ("seq_lora", "a", 0), ("seq_lora", "a", 1), ("seq_lora", "b", 0), ("seq_lora", "b", 1),
        ("reservoir replay.every=1", "b", 0), ("reservoir replay.every=2", "b", 0),
    ]
    assert runs[0].path == "seq_lora/order-a/seed0"
    assert "data.tasks=[animals,colors]" in runs[-1].overrides and "data.n_test=4" in runs[-1].overrides
    cfg = build_config("tiny,reservoir", runs[-1].overrides)
    assert cfg.data.tasks == ["animals", "colors"] and cfg.data.order == "b" and cfg.replay.every == 2 and cfg.preset == runs[-1].row


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("methods: [a]\nbogus: 1\n", "unknown key"),
        ("orders: {a: []}\nmethods: [x]\n", "at least one task"),
        ("seeds: [zero]\nmethods: [x]\n", "not an integer"),
        ("orders: [1]\ngroups: [{methods: [x], orders: [9]}]\n", "not among the plan's orders"),
        ("groups: [{methods: [x], colour: red}]\n", "unknown key"),
        ("groups: [{methods: [x], seeds: []}]\n", r"seeds: empty, so the group would plan no run"),
        ("orders: [1]\ngroups: [{methods: [x], orders: []}]\n", r"orders: empty"),
        (": : :\n", "invalid YAML"),
        ("orders: {../../elsewhere: [colors]}\nmethods: [x]\n", "order name '../../elsewhere' may hold only"),
        ("orders: [.hidden]\nmethods: [x]\n", "order name '.hidden'"),
    ],
)
def test_bad_plans_are_one_line_errors(tmp_path, text, match):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(SureclError, match=match):
        load_plan(str(f))


def test_an_order_named_as_a_number_yaml_would_rewrite_stays_itself(tmp_path):
    """``01`` and ``1`` are two orders: each run's data.order is the name as written."""
    f = tmp_path / "p.yaml"
    f.write_text("orders: {'01': [colors], '1': [animals]}\nmethods: [seq_lora]\n")
    runs = expand(load_plan(str(f)))
    assert sorted(build_config("tiny,seq_lora", r.overrides).data.order for r in runs) == ["01", "1"]
    assert len({r.path for r in runs}) == 2


def test_unquoted_numbers_in_a_plan_are_the_names_and_ratios_as_written(tmp_path):
    """YAML 1.1 reads an unquoted ``010`` as 8 and ``1:2`` as 62: an order, a task or a grid value
    written that way is its text (order ``010`` in folder order010, ratio 1:2), seeds stay numbers."""
    f = tmp_path / "p.yaml"
    f.write_text("orders: {010: [colors, animals]}\nseeds: [0, 1]\nmethods: [slow_surprise]\n"
                 "grid: {replay.ratio: [1:2, 1:4]}\n")
    plan = load_plan(str(f))
    assert list(plan.orders) == ["010"] and plan.seeds == [0, 1]
    runs = expand(plan)
    assert {r.path.split("/")[-2] for r in runs} == {"order010"}
    cfgs = [build_config("tiny,slow_surprise", r.overrides) for r in runs]
    assert sorted({c.replay.ratio for c in cfgs}) == ["1:2", "1:4"] and {c.data.order for c in cfgs} == {"010"}


def test_an_unknown_metric_stops_the_sweep_before_any_run_trains(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "--metric", "bogus", "--config", "tiny", "--methods", "seq_lora", "--out", str(out), "--quiet",
                 "data.tasks=[colors]", "data.n_train=8", "data.n_test=4", "train.epochs=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--metric: unknown metric 'bogus'" in err[0]
    assert not list(out.rglob("results.json"))


def test_unknown_plan_name_exits_2(tmp_path, capsys):
    assert main(["sweep", "--plan", "nope", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown plan 'nope'" in err[0]


def test_protocol_preset_orders_are_the_sweep_default():
    assert _preset_orders("paper-t5,lnt") == ["4", "5", "6"]
    assert _preset_orders("paper-t5,standard-cl") == ["1", "2", "3"]
    assert _preset_orders("tiny") is None


def test_command_line_replaces_plan_values_and_keeps_named_orders(tmp_path, tiny_cache, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    f = tmp_path / "study.yaml"
    f.write_text("config: tiny\norders: {a: [colors], b: [animals]}\nseeds: [0, 1, 2]\nmethods: [seq_lora, reservoir]\n"
                 "overrides: [train.epochs=3, data.n_train=16]\n")
    out = tmp_path / "out"
    assert main(["sweep", "--plan", str(f), "--out", str(out), "--methods", "seq_lora", "--orders", "b", "--seeds", "1", "--quiet",
                 "train.epochs=1", "data.n_train=8", "data.n_test=4"]) == 0
    plan = json.loads((out / "sweep.json").read_text())
    assert [r["path"] for r in plan["runs"]] == ["seq_lora/order-b/seed1"]
    res = json.loads((out / "seq_lora/order-b/seed1/results.json").read_text())
    assert res["tasks"] == ["animals"]
    # the command line's overrides replace the plan's own
    assert (res["config"]["train"]["epochs"], res["config"]["data"]["n_train"]) == (1, 8)


def test_finished_runs_stay_finished_when_the_config_gains_a_key():
    cfg = build_config("tiny,slow_surprise")
    saved = cfg.to_dict()
    del saved["train"]["fresh_optimizer"]  # as written by a version without that key
    assert same_config(saved, cfg)
    saved["train"]["batching"] = "uniform"
    assert not same_config(saved, cfg)
    legacy = cfg.to_dict()
    legacy["data"]["balanced"] = True  # a key that no longer exists
    assert not same_config(legacy, cfg)


def test_another_methods_options_do_not_make_a_run_different():
    """A run saved before a default of N-LoRA's (or O-LoRA's, or Progressive Prompts') options
    changed is the same run for every method that does not read them, and a different one for
    the method that does."""
    for method in ("seq_lora", "olora", "progressive_prompts", "nlora"):
        cfg = build_config(f"tiny,{method}")
        saved = cfg.to_dict()
        saved["nlora"]["lambda_l1"] = cfg.nlora.lambda_l1 * 1000  # as saved under another default
        assert same_config(saved, cfg) == (method != "nlora"), method
        saved = cfg.to_dict()
        saved["prompts"]["length"] = cfg.prompts.length + 1
        saved["olora"]["lambda_orth"] = cfg.olora.lambda_orth + 1
        assert same_config(saved, cfg) == (method == "seq_lora" or method == "nlora"), method
    saved = build_config("tiny,nlora").to_dict()
    assert not same_config(saved, build_config("tiny,olora"))  # another method is another run


def test_a_results_file_that_is_not_an_object_stops_the_sweep_in_one_line(tmp_path, capsys):
    f = tmp_path / "study.yaml"
    f.write_text("config: tiny\norders: {a: [colors]}\nseeds: [0]\nmethods: [seq_lora]\n")
    run_dir = tmp_path / "out" / "seq_lora" / "order-a" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text("[]")
    assert main(["sweep", "--plan", str(f), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("surecl: error: ") and "not a readable results file" in err[-1] and "Traceback" not in "".join(err)
    assert (run_dir / "results.json").read_text() == "[]"


def test_a_sweep_never_replaces_a_users_table(tmp_path, capsys):
    """A folder no sweep wrote (no sweep.json) holding a table.md: the end-of-sweep table would
    replace it, so the sweep stops before any run, in one line."""
    f = tmp_path / "study.yaml"
    f.write_text("config: tiny\norders: {a: [colors]}\nseeds: [0]\nmethods: [seq_lora]\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "table.md").write_text("my table")
    assert main(["sweep", "--plan", str(f), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "table.md exists and no surecl sweep wrote" in err[0]
    assert (out / "table.md").read_text() == "my table" and sorted(p.name for p in out.iterdir()) == ["table.md"]


@pytest.mark.parametrize("argv, words", [
    (["seed=3"], "seed is set for each run by the sweep; give it with --seeds"),
    (["data.order=2"], "data.order is set for each run by the sweep; give it with --orders"),
    (["--grid", "seed=0,1"], "seed is set for each run by the sweep"),
    (["--orders", "a,b", "data.tasks=[colors]"], "data.tasks gives one task list to every order"),
    # the same, set in a form the override check does not read: caught on the built configs
    (["--orders", "1,2", "data={tasks: [colors, animals], n_train: 4, n_test: 2}"], "orders 1 and 2 of row seq_lora train the same task list"),
])
def test_keys_the_sweep_sets_itself_are_refused_as_overrides(tmp_path, capsys, argv, words):
    """A sweep sets seed, data.order and preset for each run, last: as an override or a grid axis
    they were replaced without a word (a --grid seed=0,1,2 planned three identical seed-0 runs)."""
    out = tmp_path / "sw"
    assert main(["sweep", "--config", "tiny", "--methods", "seq_lora", "--out", str(out), "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not out.exists() or not any(out.iterdir())


def test_a_method_given_as_a_yaml_path_runs_inside_out(tmp_path):
    from surecl.sweep import Plan, expand

    runs = expand(Plan(methods=[str(tmp_path / "mine.yaml"), "../theirs.yaml"], orders={"default": []}, seeds=[0]))
    assert [r.path for r in runs] == ["mine/orderdefault/seed0", "theirs/orderdefault/seed0"]
    assert runs[0].row == str(tmp_path / "mine.yaml")  # the row keeps its name


def test_a_packaged_plans_name_is_the_plan_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    """`surecl sweep --plan ablation-beta --out ablation-beta` run again from the same folder: the
    study's own folder does not hide the packaged plan; a folder with another name is still refused."""
    from surecl.sweep import load_plan

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ablation-beta").mkdir()
    assert load_plan("ablation-beta").grid or load_plan("ablation-beta").groups
    (tmp_path / "mine").mkdir()
    with pytest.raises(SureclError, match="--plan: mine is not a file"):
        load_plan("mine")


def test_an_edited_plan_stops_before_it_trains_anything(tmp_path, capsys, tiny_cache, monkeypatch):
    """A finished run whose config the edited plan changes is refused before any other run
    trains (before, the new plan's runs ran first and the study ended up with both configs)."""
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    out = tmp_path / "sw"
    base = ["sweep", "--config", "tiny", "--methods", "seq_lora", "--out", str(out), "--quiet"]
    data = ["data.tasks=[colors,animals]", "data.n_train=4", "train.epochs=1"]
    assert main([*base, "--seeds", "1", *data, "data.n_test=4"]) == 0
    capsys.readouterr()
    assert main([*base, "--seeds", "0,1", *data, "data.n_test=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "already holds a finished run with a different config" in err[-1], err
    assert not list(out.rglob("seed0"))  # nothing of the new plan was trained


def _sweep_args(tmp_path, *argv):
    from surecl.cli import _parse, build_parser, sweep_plan

    return sweep_plan(_parse(build_parser(), ["sweep", "--out", str(tmp_path / "out"), *argv]))


def test_a_grid_value_naming_a_path_stays_one_folder_under_out(tmp_path):
    """A grid over local paths (model.name, data.benchmark) put ``../`` runs outside --out, where
    neither the closing table nor the report finds them; now the value is one folder name."""
    from surecl.sweep import Plan

    runs = expand(Plan(methods=["seq_lora"], grid={"data.benchmark": ["../../../bench_a", "/data/bench_b"]}))
    out = (tmp_path / "out").resolve()
    for r in runs:
        where = (out / r.path).resolve()
        assert out in where.parents and len(Path(r.path).parts) == 4, r.path
    assert [r.row for r in runs] == ["seq_lora data.benchmark=../../../bench_a", "seq_lora data.benchmark=/data/bench_b"]


def test_a_plan_without_orders_runs_its_protocol_presets_orders(tmp_path):
    """As the command line does without a plan (lnt -> orders 4, 5, 6); a plan naming its
    orders keeps them, and --orders still wins."""
    f = tmp_path / "p.yaml"
    f.write_text("config: lnt\nmethods: [seq_lora]\n")
    assert list(_sweep_args(tmp_path, "--plan", str(f)).orders) == ["4", "5", "6"]
    assert list(_sweep_args(tmp_path, "--plan", str(f), "--orders", "5").orders) == ["5"]
    f.write_text("config: lnt\nmethods: [seq_lora]\norders: ['4']\n")
    assert list(_sweep_args(tmp_path, "--plan", str(f)).orders) == ["4"]
    f.write_text("config: tiny\nmethods: [seq_lora]\n")
    assert list(_sweep_args(tmp_path, "--plan", str(f)).orders) == ["default"]


def test_methods_on_a_grouped_plan_keep_their_groups_settings(tmp_path):
    """--methods picks methods out of a plan's groups: each keeps its group's seeds and
    overrides (they were dropped, so the run differed from the plan's); a method no group
    names runs with the plan's own settings."""
    f = tmp_path / "grp.yaml"
    f.write_text("config: tiny\nseeds: [0]\noverrides: [train.epochs=2]\ngroups:\n"
                 "  - {methods: [seq_lora], seeds: [3], overrides: [train.epochs=1]}\n"
                 "  - {methods: [reservoir, surprise], overrides: [train.epochs=1]}\n")
    runs = expand(_sweep_args(tmp_path, "--plan", str(f), "--methods", "seq_lora,surprise,slow_surprise"))
    got = {(r.method, r.seed): r.overrides for r in runs}
    assert set(got) == {("seq_lora", 3), ("surprise", 0), ("slow_surprise", 0)}
    assert "train.epochs=1" in got[("seq_lora", 3)] and "train.epochs=1" in got[("surprise", 0)]
    assert "train.epochs=1" not in got[("slow_surprise", 0)] and "train.epochs=2" in got[("slow_surprise", 0)]


def test_one_run_planned_under_two_names_is_named(tmp_path, tiny_cache, monkeypatch, capsys):
    """A grid value written two ways (1 and 1.0) is one run under two rows: it would train twice
    and count twice; the sweep says so before it trains (a warning: a finished study may hold both)."""
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    f = tmp_path / "p.yaml"
    f.write_text("config: tiny\nmethods: [seq_lora]\ngrid: {train.epochs: [1, 1.0]}\n"
                 "overrides: [data.n_train=8, data.n_test=4, 'data.tasks=[colors]']\n")
    assert main(["sweep", "--plan", str(f), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert ("surecl: warning: seq_lora/train.epochs=1/orderdefault/seed0 and seq_lora/train.epochs=1.0/orderdefault/seed0 are "
            "the same run under two names") in err
    f.write_text("config: tiny\nmethods: [seq_lora]\ngrid: {train.epochs: [1, 2]}\noverrides: [data.n_train=8, data.n_test=4, 'data.tasks=[colors]']\n")
    assert main(["sweep", "--plan", str(f), "--out", str(tmp_path / "out2"), "--quiet"]) == 0
    assert "same run under two names" not in capsys.readouterr().err


def test_a_grid_value_yaml_would_read_as_other_text_trains_as_written(tmp_path):
    """A grid value ``exp #2``: each run's override was parsed as YAML, which reads `` #2`` as a
    comment, so the folder named for exp #2 trained exp (and its row name lost the #2 too)."""
    f = tmp_path / "p.yaml"
    f.write_text('grid: {model.name: ["/models/exp #2", "/models/exp", "/models/run \'b\'"], lora.target_modules: ["[q_proj, v_proj]"]}\n'
                 "methods: [seq_lora]\n")
    runs = expand(load_plan(str(f)))
    cfgs = {r.path: build_config("tiny,seq_lora", r.overrides) for r in runs}
    assert sorted(c.model.name for c in cfgs.values()) == ["/models/exp", "/models/exp #2", "/models/run 'b'"]
    assert all(c.lora.target_modules == ["q_proj", "v_proj"] for c in cfgs.values())  # a list value stays a list
    assert sorted(c.preset for c in cfgs.values()) == sorted(r.row for r in runs)
    assert any(c.preset.endswith("model.name=/models/exp #2 lora.target_modules=[q_proj, v_proj]") for c in cfgs.values())
    # a row name ending in a quote keeps it (the report finds the run under its planned row)
    f.write_text('grid: {model.name: ["/models/run \'b\'"]}\nmethods: [seq_lora]\n')
    [r] = expand(load_plan(str(f)))
    assert build_config("tiny,seq_lora", r.overrides).preset == r.row == "seq_lora model.name=/models/run 'b'"


@pytest.mark.parametrize("argv", [["run", "--config", "tiny", "--out", ""], ["sweep", "--config", "tiny", "--methods", "seq_lora", "--out", ""]])
def test_an_empty_out_is_one_line(argv, tmp_path, capsys, monkeypatch):
    """An unset shell variable gives --out "": run wrote into its default folder, sweep into the
    current one."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out: empty" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_float_grid_values_name_their_runs_as_before(tmp_path):
    """A plan's 1.0e-3 names its run folder train.lr=0.001, as plans written before name their
    finished runs (a folder named by the YAML text would train them again)."""
    f = tmp_path / "p.yaml"
    f.write_text("grid: {train.lr: [1.0e-3, 5.0e-4], replay.ratio: [1:2]}\nmethods: [surprise]\n")
    runs = expand(load_plan(str(f)))
    assert sorted(r.path.split("/")[1] for r in runs) == ["train.lr=0.0005", "train.lr=0.001"]
    assert {r.path.split("/")[2] for r in runs} == {"replay.ratio=1:2"}


def test_an_empty_csv_or_md_is_one_line(tmp_path, capsys):
    root = tmp_path / "r"
    (root / "a").mkdir(parents=True)
    (root / "a" / "results.json").write_text("{}")
    for flag in ("--csv", "--md"):
        assert main(["report", str(root), flag, ""]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{flag}: empty" in err[0], err
