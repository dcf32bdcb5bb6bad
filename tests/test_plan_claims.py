"""A sweep plan's own claims (its ``claims`` key): checked when the plan loads and when the
sweep starts, kept in sweep.json, and tested by every ``surecl report --layout paper`` of the
folder beside the paper's claims, so a study's claims table is one command without options."""

from __future__ import annotations

import json

import pytest
from test_report import SMALL, claims_csv, make_runs

from surecl.cli import main
from surecl.errors import SureclError
from surecl.report import PLAN_FILE, paper_report, write_sweep_plan
from surecl.sweep import load_plan


def _plan(tmp_path, text):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    return f


def test_a_plans_claims_are_read_once_each_in_their_order(tmp_path):
    plan = load_plan(str(_plan(tmp_path, 'methods: [seq_lora]\nclaims: ["slow_surprise>seq_lora", "a < b", "slow_surprise>seq_lora"]\n')))
    assert plan.claims == ["slow_surprise>seq_lora", "a < b"]
    assert load_plan(str(_plan(tmp_path, "methods: [seq_lora]\n"))).claims == []


@pytest.mark.parametrize("claims, words", [
    ('"slow_surprise>seq_lora"', "must be a list"),
    ("[seq_lora]", "must look like 'A>B'"),
    ('["a>b>c"]', "must look like 'A>B'"),
    ('[">b"]', "must name a row on each side"),
    ('["a>a"]', "compares a row with itself"),
    ("[[a, b]]", "must be a text like 'A>B'"),
])
def test_a_malformed_claim_in_a_plan_is_one_line(tmp_path, claims, words):
    with pytest.raises(SureclError, match=words) as err:
        load_plan(str(_plan(tmp_path, f"methods: [seq_lora]\nclaims: {claims}\n")))
    assert "claims" in str(err.value) and "\n" not in str(err.value)


def test_the_report_tests_the_plans_claims_beside_the_papers(tmp_path):
    runs = make_runs(tmp_path / "runs", draw="order")
    base = paper_report([runs])
    assert ("seq_lora", "slow_surprise (fast)") not in base.claims
    write_sweep_plan(runs, [], {"claims": ["seq_lora>slow_surprise (fast)"]})
    rep = paper_report([runs])
    assert rep.claims == [*base.claims, ("seq_lora", "slow_surprise (fast)")]
    row = claims_csv(rep)[("seq_lora > slow_surprise (fast)", "all")]
    # SEQ minus FASTV over the six (order, seed) units: each unit its own pair
    assert float(row["mean_diff"]) == pytest.approx((-15 - 13 - 16 - 14 - 15 - 12) / 6)
    assert row["verdict"] == "contradicted"
    # --claims none leaves the paper's out and the study's in; a --claim adds to them, each once
    only = paper_report([runs], claims="none", custom_claims=["seq_lora>slow_surprise (fast)", "slow_surprise>seq_lora"])
    assert only.claims == [("seq_lora", "slow_surprise (fast)"), ("slow_surprise", "seq_lora")]


def test_another_plans_claims_join_and_the_same_plans_replace_its_own(tmp_path):
    def claims():
        return json.loads((tmp_path / PLAN_FILE).read_text())["claims"]

    write_sweep_plan(tmp_path, [], {"plan": "a.yaml", "claims": ["a>b", "c>d"]})
    write_sweep_plan(tmp_path, [], {"plan": "b.yaml", "claims": ["c>d", "e>f"]})
    assert claims() == ["a>b", "c>d", "e>f"]
    # plan a edited: its claim a>b taken out leaves the reports, plan b's stay
    write_sweep_plan(tmp_path, [], {"plan": "a.yaml", "claims": ["c>d"]})
    assert claims() == ["c>d", "e>f"]
    write_sweep_plan(tmp_path, [], {"plan": "b.yaml", "claims": []})
    assert claims() == ["c>d"]
    # a sweep.json from before claims were kept per plan: its claims are its plan's
    (tmp_path / PLAN_FILE).write_text(json.dumps({"kind": "surecl-sweep-plan", "format": 1, "plan": "a.yaml", "claims": ["x>y"], "runs": []}))
    write_sweep_plan(tmp_path, [], {"plan": "c.yaml", "claims": ["u>v"]})
    assert claims() == ["x>y", "u>v"]
    write_sweep_plan(tmp_path, [], {"plan": "a.yaml", "claims": []})
    assert claims() == ["u>v"]


def test_a_plan_claim_whose_row_no_sweep_planned_is_left_out_and_named(tmp_path):
    """A sweep of some of a plan's methods keeps all its claims; the report leaves out those
    whose rows no sweep there planned, and says which, instead of stopping."""
    runs = make_runs(tmp_path / "runs", draw="order")
    write_sweep_plan(runs, [], {"claims": ["mtl>slow_surprise", "slow_surprise>seq_lora"]})
    rep = paper_report([runs], claims="none")
    assert rep.claims == [("slow_surprise", "seq_lora")]
    md = next(t for t in rep.tables if t.name == "claims").markdown
    assert "Left out: the sweep plans' claim 'mtl>slow_surprise': it names a row no sweep into these folders planned or ran" in md
    # a fast row of a row whose runs are not dual: said so, not called unplanned
    write_sweep_plan(runs, [], {"claims": ["slow_surprise>seq_lora (fast)"]})
    md = next(t for t in paper_report([runs], claims="none").tables if t.name == "claims").markdown
    assert "the sweep plans' claim 'slow_surprise>seq_lora (fast)': no run of seq_lora is dual (it has no fast row)" in md
    with pytest.raises(SureclError, match="no row 'mtl'"):  # the caller's own claim still must name a row
        paper_report([runs], custom_claims=["mtl>slow_surprise"])


def test_a_sweeps_claims_reach_its_report_and_a_misspelt_row_stops_it_before_training(tmp_path, tiny_cache, monkeypatch, capsys):
    monkeypatch.setenv("SURECL_CACHE", str(tiny_cache))
    overrides = ", ".join(f"'{o}'" for o in SMALL)
    bad = _plan(tmp_path, f"config: tiny\nmethods: [seq_lora, slow_surprise]\nlayout: paper\noverrides: [{overrides}]\n"
                          'claims: ["slow_surprise>seq_lroa"]\n')
    out = tmp_path / "out"
    assert main(["sweep", "--plan", str(bad), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no row 'seq_lroa' among the runs the sweep plans" in err[0], err
    assert not out.exists()  # nothing planned, written or trained
    # a fast row of a row whose runs are not dual names no row either
    fast = _plan(tmp_path, f"config: tiny\nmethods: [seq_lora, slow_surprise]\nlayout: paper\noverrides: [{overrides}]\n"
                           'claims: ["slow_surprise>seq_lora (fast)"]\n')
    assert main(["sweep", "--plan", str(fast), "--out", str(out), "--quiet", "--methods", "slow_surprise"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no row 'seq_lora (fast)' among the runs the sweep plans" in err[0], err
    assert "slow_surprise (fast)" in err[0] and not out.exists()
    good = _plan(tmp_path, f"config: tiny\nmethods: [seq_lora, slow_surprise]\nlayout: paper\noverrides: [{overrides}]\n"
                           'claims: ["seq_lora>slow_surprise (fast)"]\n')
    # a sweep of one of its methods keeps the plan's claims for the report
    assert main(["sweep", "--plan", str(good), "--out", str(out), "--quiet", "--methods", "seq_lora"]) == 0
    assert json.loads((out / PLAN_FILE).read_text())["claims"] == ["seq_lora>slow_surprise (fast)"]
    assert "Left out: the sweep plans' claim 'seq_lora>slow_surprise (fast)'" in (out / "report" / "claims.md").read_text()
    assert main(["sweep", "--plan", str(good), "--out", str(out), "--quiet"]) == 0
    table = (out / "report" / "claims.md").read_text()
    assert "| seq_lora > slow_surprise (fast) |" in table and "Left out" not in table
    # and a plain report of the folder tests it too
    capsys.readouterr()
    assert main(["report", str(out), "--layout", "paper"]) == 0
    assert "| seq_lora > slow_surprise (fast) |" in capsys.readouterr().out


def test_a_method_whose_own_weights_answer_plans_no_fast_row():
    """``sweep.json``'s ``dual`` flag (which a ``<row> (fast)`` claim needs) follows what the run
    writes: per_task answers with its own snapshots, so a dual run of it has no fast row."""
    from surecl.cli import _reports_fast
    from surecl.config import build_config

    assert _reports_fast(build_config("tiny,slow_surprise", ["eval.fast=true"])) is True
    assert _reports_fast(build_config("tiny,slow_surprise", ["eval.fast=false"])) is False
    assert _reports_fast(build_config("tiny,per_task", ["dual.enabled=true", "eval.fast=true"])) is False
