"""Paper report, review 25: runs whose results.json predates the ``majority`` key (they take the
rate of a run whose fingerprints prove the same test rows, or keep their tasks in the claims,
named as not judged), and average incremental accuracy under ``eval.matrix=fp_ap`` (null by
design, not a missing run). Fixture runs are hand-made results.json files."""

from __future__ import annotations

import csv
import io
import json

import pytest
from test_report import _three_task_run, claims_csv, mtl_run, put, rel, table_rows

from surecl.cli import main
from surecl.report import Study, paper_report


def _edit(root, row, seed, fn, order="4"):
    f = root / rel(row, order, seed) / "results.json"
    r = json.loads(f.read_text())
    fn(r)
    f.write_text(json.dumps(r))


def _fingerprints(seed, tasks="abc"):
    """What provenance records per task: a digest of its sampled rows (one per seed: data.draw=order)."""
    return {t: f"{t}{seed}".ljust(64, "0") for t in tasks}


def _reviewers_study(root, fingerprints="equal"):
    """The reviewer's case (fab2.py): seq_lora learns task c to 80 against a majority class of 50;
    reservoir stays at 50. seq_lora's results.json predates ``majority``. ``fingerprints``: both
    runs of a seed record equal ones ("equal"), seq_lora's of c differs ("differ"), seq_lora
    records none ("run_lacks"), or reservoir records none ("donor_lacks")."""
    for seed in range(3):
        _three_task_run(root, "seq_lora", seed, (50 + seed, 60, 80), (70, 70, 80), (33.3, 33.3, 50))
        _three_task_run(root, "reservoir", seed, (50 + seed, 60, 50), (70, 70, 50), (33.3, 33.3, 50))

        def mine(r, seed=seed):
            r.pop("majority")  # a results.json from before the key
            fps = _fingerprints(seed)
            if fingerprints == "differ":
                fps["c"] = "f" * 64
            if fingerprints != "run_lacks":
                r["provenance"] = {"data": {"source": "config", "fingerprints": fps}}

        def theirs(r, seed=seed):
            if fingerprints != "donor_lacks":
                r["provenance"] = {"data": {"source": "config", "fingerprints": _fingerprints(seed)}}

        _edit(root, "seq_lora", seed, mine)
        _edit(root, "reservoir", seed, theirs)
    return root


def _tasks(rep):
    table = next(t for t in rep.tables if t.name == "tasks")
    return table, {r["task"]: r for r in csv.DictReader(io.StringIO(table.csv))}


def test_a_run_without_majority_takes_the_rate_of_a_run_with_the_same_test_rows(tmp_path):
    """seq_lora's runs recorded no rates but the same data fingerprints as reservoir's at their
    order and seed: they take reservoir's rates, so task c, which seq_lora learns (80 against
    50), is learned and the claim sees the 10-point difference (the report said "+0.00, 3 ties":
    c was called unlearned from reservoir's runs alone and dropped)."""
    root = _reviewers_study(tmp_path / "lnt")
    rep = paper_report([root], claims="none", custom_claims=["seq_lora>reservoir"])
    claim = claims_csv(rep)[("seq_lora > reservoir", "LNT")]
    assert float(claim["mean_diff"]) == pytest.approx(10.0) and claim["sign_wins"] == "3"
    st = Study.load([root])
    assert st.unlearned("4") == []
    assert sorted(st.filled) == [("seq_lora", "4", s) for s in range(3)]
    assert st.records[("seq_lora", "4", 1)].majority == {"a": 33.3, "b": 33.3, "c": 50}
    table, rows = _tasks(rep)
    assert rows["c"]["learned"] == "1" and rows["c"]["row"] == "seq_lora" and float(rows["c"]["margin"]) == pytest.approx(30.0)
    assert rows["c"]["runs_without_rate"] == "0"
    assert "3 run(s) whose results.json predates the rates took them from a run of the same order and seed" in table.markdown
    assert "Not judged" not in table.markdown


def test_a_filled_rate_can_also_leave_a_task_out(tmp_path):
    """The fill judges, both ways: where seq_lora stays at c's majority rate too, c is unlearned
    on every run's own rate and left out of the claims (FP over a and b)."""
    root = _reviewers_study(tmp_path / "lnt")

    def at_the_rate(r):
        r["accuracy_matrix"][2][2] = 50.0

    for seed in range(3):
        _edit(root, "seq_lora", seed, at_the_rate)
    st = Study.load([root])
    assert st.unlearned("4") == ["c"]
    claims_md = next(t for t in paper_report([root], claims="none", custom_claims=["seq_lora>reservoir"]).tables
                     if t.name == "claims").markdown
    assert "order 4: c" in claims_md and "not judged" not in claims_md


@pytest.mark.parametrize("fingerprints", ["differ", "run_lacks", "donor_lacks"])
def test_a_task_is_not_called_unlearned_while_runs_that_train_it_have_no_rate(tmp_path, fingerprints):
    """Without fingerprints on both sides, or with different ones (other test rows), seq_lora's
    runs get no rate for c: whether they learned it is unknown, so c stays in the claims (the
    10-point difference counts), and the tasks table says which runs were not judged and how to
    recompute their rates."""
    root = _reviewers_study(tmp_path / "lnt", fingerprints)
    rep = paper_report([root], claims="none", custom_claims=["seq_lora>reservoir"])
    claim = claims_csv(rep)[("seq_lora > reservoir", "LNT")]
    assert float(claim["mean_diff"]) == pytest.approx(10.0)
    st = Study.load([root])
    assert st.unlearned("4") == []
    c = next(t for t in st.task_rates("4") if t.task == "c")
    assert not c.learned and not c.judged and c.unjudged == (("seq_lora", 0), ("seq_lora", 1), ("seq_lora", 2))
    table, rows = _tasks(rep)
    assert rows["c"]["learned"] == "0" and rows["c"]["runs_without_rate"] == "3"
    assert table_rows(rep.markdown(), "Tasks learned above their majority class")["4"][-1] == "not judged"  # the last row: c
    assert "**Not judged**: 3 run(s) have no rate" in table.markdown and "order 4: seq_lora (seeds 0, 1, 2)" in table.markdown
    assert "bench/majority_rates.py" in table.markdown
    claims_md = next(t for t in rep.tables if t.name == "claims").markdown
    assert "left out (no row above it" not in claims_md and "Kept in although" in claims_md and "order 4: c" in claims_md
    if fingerprints == "differ":  # a and b are proven the same rows: their rates are filled, c's alone is not
        assert st.records[("seq_lora", "4", 0)].majority == {"a": 33.3, "b": 33.3}
        assert rows["a"]["runs_without_rate"] == "0"


# --------------------------------------------------------------------------- eval.matrix=fp_ap


def _fp_ap(root, row, seed, fast=None, matrix="fp_ap", value=None):
    """A 2-task run whose avg_incremental is ``value`` (None: as fp_ap leaves it on a longer stream)."""
    d = put(root, row, "4", seed, 40.0 + seed, 80.0, fast=fast, draw="order")

    def edit(r):
        r["config"]["eval"] = {"matrix": matrix}
        r["avg_incremental"] = value
        if "fast" in r:
            r["fast"]["avg_incremental"] = value

    _edit(root, row, seed, edit)
    return d


def test_avg_incremental_does_not_apply_to_fp_ap_runs(tmp_path, capsys):
    """Under eval.matrix=fp_ap avg_incremental is null by design: the report with --metric
    avg_incremental says why, counts no missing run, marks no cell †, and its claims leave the
    order out instead of calling its units planned but absent."""
    root = tmp_path / "lnt"
    for seed in range(3):
        _fp_ap(root, "seq_lora", seed)
        _fp_ap(root, "slow_surprise", seed, fast=(50.0, 85.0))
    st = Study.load([root])
    assert st.missing("avg_incremental") == [] and st.not_applicable(("slow_surprise (fast)", "4", 0), "avg_incremental") == "fp_ap"
    assert st.applies(("seq_lora", "4", 0), "fp")
    rep = paper_report([root], metric="avg_incremental")
    md = rep.markdown()
    main_md = next(t for t in rep.tables if t.name == "main").markdown
    assert "avg. incremental does not apply to the runs of seq_lora, slow_surprise, slow_surprise (fast)" in main_md
    assert "eval.matrix=fp_ap" in main_md and "†" not in main_md and 'have no runs at all' not in main_md
    assert "expected run(s) missing" not in md and "None: every expected run is present." in md
    claims = claims_csv(rep)
    row = next(line for line in next(t for t in rep.tables if t.name == "claims").markdown.splitlines()
               if line.startswith("| slow_surprise > seq_lora"))
    assert "(order 4 left out: avg. incremental does not apply)" in row and "planned" not in row
    assert claims[("slow_surprise > seq_lora", "all")]["n_planned"] == "0"  # no pair: one "all" row
    assert main(["report", str(root), "--layout", "paper", "--metric", "avg_incremental"]) == 0
    out = capsys.readouterr().out
    assert "avg_incremental is null in results.json" not in out and "does not apply" in out


def test_avg_incremental_of_other_runs_is_still_counted_or_missing(tmp_path):
    """Only fp_ap's null is by design: an fp_ap run that has the value (two tasks: every cell
    evaluated) is averaged, and a full-matrix run with a null value is a missing one."""
    root = tmp_path / "lnt"
    _fp_ap(root, "seq_lora", 0, value=61.0)
    _fp_ap(root, "seq_lora", 1, matrix="full")
    st = Study.load([root])
    assert st.order_cell("seq_lora", "4", "avg_incremental").mean == 61.0
    assert [(m.row, m.seed, m.why) for m in st.missing("avg_incremental")] == [("seq_lora", 1, "avg_incremental is null in results.json")]


def test_a_one_stage_rows_blank_forgetting_says_why(runs_mtl):
    """The forgetting table's caption says why MTL's AP and forgetting cells are blank, as the
    main table's does for fp_ap's average incremental accuracy."""
    md = next(t for t in paper_report([runs_mtl]).tables if t.name == "forgetting").markdown
    assert "AP and forgetting do not apply to the runs of mtl (they trained every task in one stage (MTL)" in md


@pytest.fixture
def runs_mtl(tmp_path):
    root = tmp_path / "mtl"
    for seed in (0, 1):
        put(root, "seq_lora", "1", seed, 40.0 + seed, 80.0)
        mtl_run(root, "1", seed)
    return root
