"""``surecl report`` and ``surecl run`` refuse in one line what they did without a word: ``--csv``
over another run's results.json (the run then refused to be read again), an orders table left
empty (or short) by a metric the runs leave null, a results.json whose ``provenance`` is not a
mapping (a traceback), an empty ``--log-with``."""

from __future__ import annotations

import json

import pytest
from test_cli_review22 import SMALL, code_of, one_error

from surecl.cli import main


def put_run(root, order="1", seed=0, **values):
    """A finished two-task run's results.json, as ``surecl report`` reads it; ``values`` replace
    its metrics (None: null) and add keys (``config_eval``: its config's eval section)."""
    d = root / "seq_lora" / f"order{order}" / f"seed{seed}"
    d.mkdir(parents=True)
    res = {"tasks": ["a", "b"], "metric": "accuracy", "accuracy_matrix": [[80.0, None], [40.0, 80.0]], "fp": 60.0, "ap": 80.0,
           "forgetting": 40.0, "bwt": -40.0, "avg_incremental": 70.0,
           "config": {"preset": "seq_lora", "method": "sequential", "seed": seed, "data": {"order": order}, "dual": {"enabled": False},
                      "replay": {"policy": "none"}, "eval": values.pop("config_eval", {"matrix": "all"})}}
    res.update(values)
    (d / "results.json").write_text(json.dumps(res))
    return d


@pytest.fixture(scope="module")
def finished(tiny_cache, tmp_path_factory):
    """A real finished tiny run (its folder holds the manifest surecl run writes)."""
    root = tmp_path_factory.mktemp("finished")
    mp = pytest.MonkeyPatch()
    mp.setenv("SURECL_CACHE", str(tiny_cache))
    mp.setenv("OMP_NUM_THREADS", "1")
    argv = ["run", "--config", "tiny,seq_lora", "--quiet", "--out", str(root / "run"), *SMALL]
    assert main(argv) == 0
    yield root / "run", argv
    mp.undo()


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("target", ["results.json", "config.yaml", "report.md", "notes.csv", "adapters/fast/x.csv", "checkpoints/t.md"])
@pytest.mark.parametrize("flag", ["--csv", "--md"])
def test_report_never_writes_into_another_run_folder(finished, tmp_path, capsys, target, flag):
    """``surecl report r1 --csv r_fpap/results.json`` put a CSV in that finished run's
    results.json (exit 0); rerunning the run then refused its folder. Any path inside a run
    folder (its own files, or a name it may write later) is refused in one line, nothing written,
    and the run is still finished."""
    run, argv = finished
    reported = put_run(tmp_path / "runs")
    before = snapshot(run)
    assert code_of(["report", str(tmp_path / "runs"), flag, str(run / target)]) == 2
    err = one_error(capsys)
    assert f"inside the run folder {run}" in err and ".surecl-manifest.json" in err, err
    assert snapshot(run) == before
    assert sorted(p.name for p in reported.iterdir()) == ["results.json"]
    assert main(argv) == 0  # still a readable, finished run
    assert "already finished" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["orders", "paper"])
def test_report_refuses_surecl_records_outside_run_folders(tmp_path, capsys, layout):
    """A run's results.json in a folder without a manifest (an earlier version's), a sweep's
    sweep.json and a report's .surecl-report.json are surecl's records: refused, unchanged."""
    runs = tmp_path / "runs"
    put_run(runs)
    other = put_run(tmp_path / "other", seed=3)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"kind": "surecl-sweep-plan", "runs": []}))
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / ".surecl-report.json").write_text(json.dumps({"files": ["report.md"]}))
    for target, words in ((other / "results.json", "a surecl run's results.json"), (sweep / "sweep.json", "a sweep's plan"),
                          (rep / ".surecl-report.json", "surecl's own record")):
        before = target.read_bytes()
        assert code_of(["report", str(runs), "--layout", layout, "--csv", str(target)]) == 2
        err = one_error(capsys)
        assert words in err, err
        assert target.read_bytes() == before


@pytest.mark.parametrize("target", ["report.md", "buffer.json", "results.json", "new.csv"])
def test_a_run_folder_without_manifest_or_lock_is_still_a_run_folder(finished, tmp_path, capsys, target):
    """A study's committed run folders hold results.json, report.md and buffer.json alone (no
    manifest or lock, which git leaves out), as do runs made before those existed: ``--md`` into
    such a folder replaced its report.md, ``--csv`` its buffer.json. Its results.json, or a run's
    config.yaml, marks it too."""
    run, _ = finished
    runs = tmp_path / "runs"
    put_run(runs)
    for kept, mark in ((("results.json", "report.md", "buffer.json"), "results.json"), (("config.yaml", "report.md", "buffer.json"), "config.yaml")):
        study = tmp_path / f"study-{mark}" / "seed0"
        study.mkdir(parents=True)
        for name in kept:
            (study / name).write_bytes((run / name).read_bytes())
        before = snapshot(study)
        assert code_of(["report", str(runs), "--md" if target.endswith(".md") else "--csv", str(study / target)]) == 2
        err = one_error(capsys)
        assert f"inside the run folder {study} (it holds {mark})" in err, err
        assert snapshot(study) == before


def test_report_still_replaces_a_users_files(tmp_path, capsys):
    """What ``--csv X`` asks for stays: a plain file elsewhere, a JSON file of the user's named
    results.json, a table an earlier report wrote (listed in .surecl-report.json)."""
    runs = tmp_path / "runs"
    put_run(runs)
    mine = tmp_path / "mine.csv"
    mine.write_text("old\n")
    theirs = tmp_path / "notes" / "results.json"
    theirs.parent.mkdir()
    theirs.write_text(json.dumps({"loss": 1}))
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / ".surecl-report.json").write_text(json.dumps({"files": ["main.csv"]}))
    (rep / "main.csv").write_text("old\n")
    for target in (mine, theirs, rep / "main.csv"):
        assert main(["report", str(runs), "--csv", str(target)]) == 0
        assert target.read_text().startswith("method,order_1_mean"), target
    capsys.readouterr()


def test_a_sweep_into_a_run_folder_is_refused_before_it_trains(finished, capsys, monkeypatch):
    """Its closing table would be refused after every run trained: said first, nothing written."""
    import surecl.trainer

    run, _ = finished
    monkeypatch.setattr(surecl.trainer, "run", lambda *a, **k: pytest.fail("a run was trained"))
    before = snapshot(run)
    assert code_of(["sweep", "--config", "tiny", "--methods", "seq_lora", "--out", str(run / "sw"), "--quiet", *SMALL]) == 2
    err = one_error(capsys)
    assert "table.csv" in err and "inside the run folder" in err, err
    assert snapshot(run) == before and not (run / "sw").exists()


@pytest.mark.parametrize(("case", "layout", "out"), [*((c, "orders", o) for c in ("fp_ap", "one_task") for o in ("--csv", "--md", None)),
                                                     *(("one_task", "paper", o) for o in ("--csv", "--md", None, "--out-dir"))])
def test_a_metric_no_run_has_is_one_line(tmp_path, capsys, case, out, layout):
    """``--metric avg_incremental`` over eval.matrix=fp_ap runs, or ``bwt`` over a one-task
    stream, printed a table of a header alone (and ``--csv`` wrote one) with exit code 0; the
    paper layout printed and wrote tables of dashes for the one-task runs, every run "missing"
    (its fp_ap tables say "does not apply": test_report_review25)."""
    runs = tmp_path / "runs"
    if case == "fp_ap":
        metric = "avg_incremental"
        for seed in (0, 1):
            put_run(runs, seed=seed, avg_incremental=None, accuracy_matrix=[[80.0, None], [40.0, 80.0]], config_eval={"matrix": "fp_ap"})
    else:
        metric = "bwt"
        put_run(runs, tasks=["a"], accuracy_matrix=[[80.0]], bwt=None, forgetting=0.0)
    target = tmp_path / "t.out"
    assert code_of(["report", str(runs), "--metric", metric, "--layout", layout, *([out, str(target)] if out else [])]) == 2
    err = one_error(capsys)
    assert f"no run has {metric}" in err and "null in results.json" in err, err
    assert ("eval.matrix=fp_ap" if case == "fp_ap" else "one-task stream") in err, err
    assert capsys.readouterr().out == "" and not target.exists()


def test_runs_left_out_for_a_null_metric_are_counted(tmp_path, capsys):
    """A run whose metric is null left its cell without a word: a warning names how many."""
    runs = tmp_path / "runs"
    put_run(runs, seed=0)
    put_run(runs, seed=1, tasks=["a"], accuracy_matrix=[[80.0]], bwt=None)
    assert main(["report", str(runs), "--metric", "bwt", "--csv", str(tmp_path / "t.csv")]) == 0
    cap = capsys.readouterr()
    warned = [line for line in cap.err.splitlines() if "leaves out" in line]
    assert len(warned) == 1 and "1 of 2 runs" in warned[0] and "bwt" in warned[0] and "one-task stream" in warned[0], cap.err
    assert "| seq_lora | -40.0 |" in cap.out
    assert (tmp_path / "t.csv").read_text().splitlines()[1].startswith("seq_lora,-40.0,,1")


@pytest.mark.parametrize("provenance", ["x", ["a"], {"model": "x"}, {"data": 3}])
@pytest.mark.parametrize("layout", ["orders", "paper"])
def test_a_provenance_that_is_not_a_mapping_is_one_line(tmp_path, capsys, provenance, layout):
    """``provenance: "x"`` raised AttributeError in report._as_run / model_words."""
    runs = tmp_path / "runs"
    put_run(runs, provenance=provenance)
    assert code_of(["report", str(runs), "--layout", layout]) == 2
    err = one_error(capsys)
    assert "not a surecl results file (provenance" in err and "is not a mapping" in err, err


def test_a_provenance_mapping_or_none_is_read(tmp_path, capsys):
    runs = tmp_path / "runs"
    put_run(runs, seed=0, provenance={"model": {"source": "config"}, "data": None})
    put_run(runs, seed=1, provenance=None)
    assert main(["report", str(runs)]) == 0
    assert "| seq_lora | 60.0 ± 0.0 |" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_an_empty_log_with_is_refused(tmp_path, capsys, value):
    """``--log-with ''`` (an unset variable) ran without a tracker and without a word, where an
    empty --config or --plan is refused."""
    out = tmp_path / "r"
    for extra in (["--dry-run"], []):
        assert code_of(["run", "--config", "tiny,seq_lora", "--out", str(out), "--log-with", value, *extra, *SMALL]) == 2
        assert "--log-with: empty" in one_error(capsys)
    assert code_of(["run", "--config", "tiny,seq_lora", "--out", str(out), "--log-with", "tensorboard", "--log-with", value,
                    "--dry-run", *SMALL]) == 2
    assert "--log-with: empty" in one_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize("where", ["build_parser", "_imports"])
def test_ctrl_c_while_the_command_starts_is_one_line(monkeypatch, capsys, where):
    """A Ctrl-C before the command's own handling (its imports, the parser) ended in a
    KeyboardInterrupt traceback and a death by SIGINT, not the run's "interrupted" line and 130."""
    import surecl.cli as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, where, interrupted)
    assert cli.main(["list"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["surecl: interrupted; rerun the same command to resume"]


def test_a_copied_run_config_alone_does_not_make_a_run_folder(finished, tmp_path, capsys):
    """A run's config.yaml (or results.json) copied into a project's folder, with no other file a
    run writes beside it, refused every --md/--csv below that folder."""
    run, _ = finished
    runs = tmp_path / "runs"
    put_run(runs)
    project = tmp_path / "project"
    (project / "reports").mkdir(parents=True)
    (project / "config.yaml").write_bytes((run / "config.yaml").read_bytes())
    (project / "results.json").write_bytes((run / "results.json").read_bytes())
    assert main(["report", str(runs), "--md", str(project / "reports" / "table.md")]) == 0
    assert (project / "reports" / "table.md").read_text().startswith("FP")
    capsys.readouterr()
    (project / "report.md").write_text("a run's report\n")  # now it is a run folder's set of files
    assert code_of(["report", str(runs), "--md", str(project / "reports" / "table2.md")]) == 2
    assert f"inside the run folder {project}" in one_error(capsys)
