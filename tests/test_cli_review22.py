"""The command line refuses in one line what it ran or wrote without a word: a report file over
the results it reads (or over a link, a device, a FIFO), a sweep's typo'd order written into its
plan, a repeated or empty option, a setting preset as a method, an abbreviated option; a sweep's
errors name a remedy the sweep has; a dry run checks what the run checks; the summary line is
said once per run."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from surecl.cli import main
from surecl.config import build_config, replay_ratio
from surecl.errors import SureclError

SMALL = ["data.tasks=[colors]", "data.n_train=4", "data.n_test=2", "train.epochs=1"]


def code_of(argv: list[str]) -> int:
    """The exit code of ``surecl <argv>``: what main returns, or what argparse exits with."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("surecl: error: "), err
    return err[0]


def put_run(root, order="1", seed=0, fp=40.0):
    """A finished run's results.json, as ``surecl report`` reads it."""
    d = root / "seq_lora" / f"order{order}" / f"seed{seed}"
    d.mkdir(parents=True)
    res = {"tasks": ["a", "b"], "metric": "accuracy", "accuracy_matrix": [[80.0, None], [fp, 80.0]], "fp": fp, "ap": 80.0,
           "forgetting": 80.0 - fp, "bwt": fp - 80.0, "avg_incremental": (80.0 + fp) / 2,
           "config": {"preset": "seq_lora", "method": "sequential", "seed": seed, "data": {"order": order}, "dual": {"enabled": False},
                      "replay": {"policy": "none"}}}
    (d / "results.json").write_text(json.dumps(res))
    return d


def write_task(path, word: str) -> None:
    """A user task of 6 train / 2 test rows whose sentences start with ``word``."""
    rows = [{"task": path.stem, "instruction": "Which? ", "labels": ["warm", "cool"]}]
    rows += [{"sentence": f"{word} {i}", "label": ["warm", "cool"][i % 2], "split": "test" if i >= 6 else "train"} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def no_training(monkeypatch):
    """A sweep that gets as far as training a run fails the test."""
    import surecl.trainer

    def refuse(*args, **kwargs):
        raise AssertionError("a run was trained")

    monkeypatch.setattr(surecl.trainer, "run", refuse)


def one_topic_benchmark(bench):
    """A CL_Benchmark-shaped folder holding one task, ``topics``, which no numbered order names."""
    (bench / "TC" / "topics").mkdir(parents=True)
    (bench / "instruction_config.json").write_text(json.dumps({"TC": ["Topic? "]}))
    for split in ("train", "test"):
        (bench / "TC" / "topics" / f"{split}.json").write_text(json.dumps([{"sentence": "a", "label": "x"}]))
    (bench / "TC" / "topics" / "labels.json").write_text(json.dumps(["x"]))
    return bench


@pytest.mark.parametrize("target", ["results", "in_run", "link", "fifo", "same_file"])
@pytest.mark.parametrize("layout", ["orders", "paper"])
def test_report_never_writes_over_what_it_must_not(tmp_path, capsys, target, layout):
    """``--md`` over a results.json it reads replaced it; over a link, a FIFO (or /dev/full) it
    put a regular file in its place. Refused in one line, every file as it was."""
    runs = tmp_path / "runs"
    run = put_run(runs)
    before = (run / "results.json").read_text()
    kept = tmp_path / "kept.md"
    kept.write_text("mine\n")
    flags = {"results": ["--md", str(run / "results.json")], "in_run": ["--csv", str(run / "report.md")],
             "link": ["--md", str(tmp_path / "link.md")], "fifo": ["--csv", str(tmp_path / "fifo")],
             "same_file": ["--md", str(tmp_path / "t"), "--csv", str(tmp_path / "t")]}[target]
    (tmp_path / "link.md").symlink_to(kept)
    os.mkfifo(tmp_path / "fifo")
    assert code_of(["report", str(runs), "--layout", layout, *flags]) == 2
    err = one_error(capsys)
    words = {"results": "one of the results.json files", "in_run": "inside the run folder", "link": "symbolic link",
             "fifo": "not a regular file", "same_file": "names too"}[target]
    assert words in err, err
    assert (run / "results.json").read_text() == before and sorted(p.name for p in run.iterdir()) == ["results.json"]
    assert (tmp_path / "link.md").is_symlink() and kept.read_text() == "mine\n"
    assert (tmp_path / "fifo").is_fifo() and not (tmp_path / "t").exists()


def test_report_out_dir_inside_a_run_folder_is_refused(tmp_path, capsys):
    runs = tmp_path / "runs"
    run = put_run(runs)
    assert code_of(["report", str(runs), "--layout", "paper", "--out-dir", str(run)]) == 2
    assert "inside the run folder" in one_error(capsys)
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]


def test_report_dash_writes_to_standard_output(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    put_run(runs)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(runs), "--csv", "-"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("method,") and "|" not in out, out  # the CSV alone
    assert main(["report", str(runs), "--md", "-"]) == 0
    assert "| seq_lora | 40.0 |" in capsys.readouterr().out
    assert not (tmp_path / "-").exists()
    assert code_of(["report", str(runs), "--md", "-", "--csv", "-"]) == 2
    assert "both on standard output" in one_error(capsys)


def test_a_sweeps_errors_name_what_a_sweep_can_do(tmp_path, tiny_cache, monkeypatch, capsys):
    """A sweep has no --fresh: its runs' errors said "rerun with --fresh". A finished run missing
    a final output with no checkpoint left, and a finished run on data changed since."""
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    data = tmp_path / "t.jsonl"
    write_task(data, "w")
    out = tmp_path / "sw"
    argv = ["sweep", "--config", "tiny", "--methods", "seq_lora", "--out", str(out), "--quiet", "data.benchmark=none",
            f"data.jsonl=[{data}]", "data.n_train=4", "data.n_test=2", "train.epochs=1"]
    assert main(argv) == 0
    run = out / "seq_lora" / "orderdefault" / "seed0"
    (run / "heatmap.png").unlink()  # completed from its last checkpoint, said once (the sweep's first look said it too)
    capsys.readouterr()
    assert main(argv) == 0
    assert capsys.readouterr().err.count("finished, but heatmap.png missing") == 1
    shutil.rmtree(run / "checkpoints")
    (run / "report.md").unlink()
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    said = next(line for line in err.splitlines() if "error:" in line and "no checkpoint remains" in line)
    assert "remove that run folder and rerun the sweep to train it again" in said and "--fresh" not in said, said
    # the data changed since the run finished: refused before the sweep plans anything
    shutil.rmtree(out)
    assert main(argv) == 0
    write_task(data, "v")
    capsys.readouterr()
    assert main(argv) == 2
    err = one_error(capsys)
    assert "other rows of task t" in err and "remove that run folder and rerun the sweep" in err and "--fresh" not in err, err
    # surecl run in that folder still has --fresh
    assert main(["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(run), *argv[argv.index("data.benchmark=none"):],
                 "preset=seq_lora"]) == 2
    assert "rerun with --fresh" in one_error(capsys)


def test_an_order_the_benchmark_lacks_is_refused_before_the_plan_is_written(tmp_path, capsys, no_training):
    """``--orders 9`` on the tiny stream went into sweep.json, then each run failed: an "Order-9"
    column and a missing run in every later report, "left to resume" though no resume can."""
    out = tmp_path / "sw"
    assert code_of(["sweep", "--config", "tiny", "--methods", "seq_lora", "--orders", "9", "--out", str(out), "--quiet"]) == 2
    err = one_error(capsys)
    assert "tiny benchmark has one order (default), not '9'" in err and "seq_lora/order9/seed0" in err, err
    assert not out.exists()
    # a benchmark folder: an order it has none of the tasks of, and an unknown order name
    bench = one_topic_benchmark(tmp_path / "bench")
    for order, words in (("2", "holds none of the tasks order 2 names"), ("7", "unknown order '7'")):
        argv = ["sweep", "--config", "tiny", "--methods", "seq_lora", "--orders", f"default,{order}", "--out", str(out), "--quiet",
                f"data.benchmark={bench}"]
        assert code_of(argv) == 2
        err = one_error(capsys)
        assert words in err and f"seq_lora/order{order}/seed0" in err, err
        assert not out.exists()
    # with data.allow_missing the folder's task lists are read first: an unknown order still names its run
    argv = ["sweep", "--config", "tiny", "--methods", "seq_lora", "--orders", "9", "--out", str(out), "--quiet",
            f"data.benchmark={bench}", "data.allow_missing=true"]
    assert code_of(argv) == 2
    err = one_error(capsys)
    assert "sweep: run seq_lora/order9/seed0: data.order: unknown order '9'" in err and "in a plan" in err, err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--plan", "--methods", "--seeds", "--orders", "--config"])
def test_sweep_options_given_twice_are_refused(tmp_path, capsys, flag, no_training):
    values = {"--plan": ("paper-standard", "paper-lnt"), "--methods": ("seq_lora", "surprise"), "--seeds": ("0", "1"),
              "--orders": ("1", "2"), "--config": ("tiny", "tiny")}[flag]
    argv = ["sweep", flag, values[0], flag, values[1], "--out", str(tmp_path / "sw")]
    assert code_of(argv) == 2
    assert f"{flag} given twice" in one_error(capsys)


def test_a_grid_key_given_twice_is_refused(tmp_path, capsys, no_training):
    argv = ["sweep", "--config", "tiny", "--methods", "seq_lora", "--grid", "replay.every=1", "--grid", "replay.every=2",
            "--out", str(tmp_path / "sw")]
    assert code_of(argv) == 2
    assert "--grid replay.every given twice" in one_error(capsys)
    assert not (tmp_path / "sw").exists()


def _sweep_plan(tmp_path, *argv):
    from surecl.cli import _parse, build_parser, sweep_plan

    return sweep_plan(_parse(build_parser(), ["sweep", "--out", str(tmp_path / "out"), *argv]))


def test_grid_values_split_only_outside_brackets(tmp_path):
    """``[q_proj,v_proj],[q_proj]`` was four pieces: ``[q_proj``, ``v_proj]``, ..."""
    from surecl.sweep import expand

    plan = _sweep_plan(tmp_path, "--config", "tiny", "--methods", "seq_lora", "--grid", "lora.target_modules=[q_proj,v_proj],[q_proj]",
                       "--grid", "replay.every=1, 2")
    assert plan.grid == {"lora.target_modules": ["[q_proj,v_proj]", "[q_proj]"], "replay.every": ["1", "2"]}
    got = sorted(tuple(build_config("tiny,seq_lora", r.overrides).lora.target_modules) for r in expand(plan) if "replay.every=1" in r.point)
    assert got == [("q_proj",), ("q_proj", "v_proj")]
    with pytest.raises(SureclError, match=r"leaves a bracket open"):
        _sweep_plan(tmp_path, "--methods", "seq_lora", "--grid", "lora.target_modules=[q_proj,v_proj")


@pytest.mark.parametrize("argv", [["run", "--config", "", "--dry-run"], ["sweep", "--config", " ", "--methods", "seq_lora"],
                                  ["sweep", "--plan", ""]])
def test_an_empty_plan_or_config_is_refused(tmp_path, capsys, argv, no_training):
    """As ``--out ''`` is: an unset shell variable ran the defaults."""
    assert code_of([*argv, "--out", str(tmp_path / "out")]) == 2
    assert f"{argv[1]}: empty" in one_error(capsys)
    assert not (tmp_path / "out").exists()


def test_a_setting_preset_is_not_a_method(tmp_path, capsys, no_training):
    """``--methods seq_lora,cpt`` ran the default method under the name cpt."""
    assert code_of(["sweep", "--config", "tiny", "--methods", "seq_lora,cpt", "--out", str(tmp_path / "sw")]) == 2
    err = one_error(capsys)
    assert "--methods: cpt is a setting preset, not a method" in err, err
    plan = tmp_path / "p.yaml"
    plan.write_text("config: tiny\ngroups:\n  - {methods: [seq_lora]}\n  - {methods: [lnt]}\n")
    assert code_of(["sweep", "--plan", str(plan), "--out", str(tmp_path / "sw")]) == 2
    assert "lnt is a setting preset" in one_error(capsys)
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("argv", [["--imp", "no_such_module_x", "list"], ["report", "RUNS", "--out", "X"],
                                  ["run", "--config", "tiny,seq_lora", "--dry", "--out", "X"]])
def test_abbreviated_options_are_not_taken(tmp_path, capsys, argv):
    """``--imp`` was --import but imported nothing; ``report --out`` was --out-dir."""
    put_run(tmp_path / "runs")
    argv = [a.replace("RUNS", str(tmp_path / "runs")).replace("X", str(tmp_path / "x")) for a in argv]
    assert code_of(argv) == 2
    err = one_error(capsys)
    assert "unrecognized arguments" in err or "invalid choice" in err, err
    assert not (tmp_path / "x").exists()


def test_an_order_a_folder_has_none_of_the_tasks_of_names_the_benchmark_it_needs(tmp_path):
    """data.allow_missing=true was suggested, which fails too when none of them is there."""
    from surecl.data.loading import load_stream

    bench = one_topic_benchmark(tmp_path / "bench")
    for allow in ("false", "true"):
        with pytest.raises(SureclError) as err:
            load_stream(build_config("tiny,seq_lora", [f"data.benchmark={bench}", "data.order=4", f"data.allow_missing={allow}"]))
        assert "order 4" in str(err.value) and "needs data.benchmark=/path/to/CL_Benchmark" in str(err.value), err.value
        assert "allow_missing" not in str(err.value)
    with pytest.raises(SureclError, match=r"holds none of the tasks colors, shapes \(its tasks: topics\)"):
        load_stream(build_config("tiny,seq_lora", [f"data.benchmark={bench}", "data.tasks=[colors,shapes]"]))


@pytest.mark.parametrize("extra", [["--out", ""], ["--log-with", "no_such_tracker"]])
def test_a_dry_run_refuses_what_the_run_refuses(capsys, extra):
    assert code_of(["run", "--config", "tiny,seq_lora", "--dry-run", *extra]) == 2
    assert ("--out: empty" if extra[0] == "--out" else "unknown tracker") in one_error(capsys)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_the_summary_line_is_said_by_the_main_process_only(tmp_path, capsys, monkeypatch, rank):
    import surecl.trainer

    monkeypatch.setattr(surecl.trainer, "run", lambda cfg, out, **kw: {"fp": 50.0, "ap": 60.0, "forgetting": 10.0})
    monkeypatch.setenv("RANK", rank)
    assert main(["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(tmp_path / "r"), *SMALL]) == 0
    out = capsys.readouterr().out
    assert ("FP 50.0" in out) == (rank == "0"), out


@pytest.mark.parametrize("value", [62, "62", "1.5"])
def test_a_bare_number_ratio_is_malformed_like_any_value(value):
    """It said an unquoted a:b in YAML is read as a base-60 number, which surecl's YAML reading
    no longer does (README), and which a SureArguments(ratio=62) user never wrote."""
    with pytest.raises(SureclError) as err:
        replay_ratio(value)
    assert "must be 'a:b' with whole numbers 1..1000" in str(err.value) and "base-60" not in str(err.value)
    with pytest.raises(SureclError, match=r"must be 'a:b'"):
        build_config("tiny", [f"replay.ratio={value}"])


def test_every_start_over_remedy_follows_the_command():
    """The errors raised while training (a non-finite loss, a checkpoint that does not fit) name
    the remedy of the command that runs: --fresh for `surecl run`, the sweep's own words in a sweep."""
    from surecl.errors import starting_over
    from surecl.step import nonfinite_rerun

    assert "start over (--fresh, or another --out)" in nonfinite_rerun()
    with starting_over("remove that run folder and rerun the sweep"):
        assert "remove that run folder and rerun the sweep" in nonfinite_rerun() and "--fresh" not in nonfinite_rerun()
    assert "--fresh" in nonfinite_rerun()


def test_a_sweep_order_the_embedded_benchmark_lacks_is_refused_before_the_plan(tmp_path, monkeypatch, capsys):
    """The packaged paper plans leave data.benchmark at the embedded default: order 4 there was
    written into sweep.json and failed at every run; now one line, naming the benchmark it needs."""
    from surecl.cli import main

    out = tmp_path / "sweep"
    code = main(["sweep", "--config", "tiny", "--methods", "seq_lora", "--seeds", "0", "--orders", "4",
                 "data.benchmark=embedded", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "the embedded benchmark" in err[0] and "data.benchmark=/path/to/CL_Benchmark" in err[0]
    assert not (out / "sweep.json").exists()
