"""Paper layout of `surecl report` (main, forgetting, ablation, claims, missing runs) and the
paired statistics behind the claims. Fixture runs are results.json files with hand-chosen
numbers; no model runs except one tiny sweep for the plan file."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from statistics import fmean, stdev

import pytest
import torch

from surecl.cli import main
from surecl.config import build_config
from surecl.errors import SureclError
from surecl.report import PLAN_FILE, Study, host_key, paper_report, parse_claim, write_sweep_plan
from surecl.stats import betainc, paired, t_cdf, t_ppf, verdict

SMALL = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", "train.epochs=1"]

# FP per (order, seed); AP fixed per row, so forgetting = AP - FP
SEQ = {("1", 0): 40.0, ("1", 1): 44.0, ("2", 0): 50.0, ("2", 1): 52.0, ("4", 0): 30.0, ("4", 1): 35.0}
SLOW = {("1", 0): 60.0, ("1", 1): 64.0, ("2", 0): 70.0, ("2", 1): 72.0, ("4", 0): 50.0, ("4", 1): 54.0}
FASTV = {("1", 0): 55.0, ("1", 1): 57.0, ("2", 0): 66.0, ("2", 1): 66.0, ("4", 0): 45.0, ("4", 1): 47.0}


def results(row, order, seed, fp, ap, fast=None, kind="accuracy", draw=None):
    """``draw``: config data.draw ("shared" or "order"); None leaves the key out, as results.json
    files from before it existed do (read as "shared")."""
    method = row.split()[0].removesuffix(" (fast)")
    res = {
        "tasks": ["a", "b"], "metric": kind, "accuracy_matrix": [[ap, None], [fp, ap]],
        "fp": fp, "ap": ap, "forgetting": ap - fp, "bwt": fp - ap, "avg_incremental": (ap + fp) / 2,
        "config": {"preset": row, "method": "sequential", "seed": seed, "data": {"order": order}, "dual": {"enabled": fast is not None},
                   "replay": {"policy": "surprise" if "surprise" in method else "none"}},
    }
    if draw is not None:
        res["config"]["data"]["draw"] = draw
    if fast is not None:
        fast_fp, fast_ap = fast
        res["fast"] = {"accuracy_matrix": [[fast_ap, None], [fast_fp, fast_ap]], "fp": fast_fp, "ap": fast_ap,
                       "forgetting": fast_ap - fast_fp, "bwt": fast_fp - fast_ap, "avg_incremental": (fast_ap + fast_fp) / 2}
    return res


def rel(row, order, seed):
    return "/".join([*row.split(), f"order{order}", f"seed{seed}"])


def put(root, row, order, seed, fp, ap, fast=None, kind="accuracy", draw=None):
    d = root / rel(row, order, seed)
    d.mkdir(parents=True, exist_ok=True)
    (d / "results.json").write_text(json.dumps(results(row, order, seed, fp, ap, fast, kind, draw)))
    return d


def make_runs(root, draw=None):
    for (order, seed), fp in SEQ.items():
        put(root, "seq_lora", order, seed, fp, 80.0, draw=draw)
    for (order, seed), fp in SLOW.items():
        put(root, "slow_surprise", order, seed, fp, 90.0, fast=(FASTV[(order, seed)], 85.0), draw=draw)
    return root


@pytest.fixture
def runs(tmp_path):
    """Runs from before data.draw was recorded: shared samples, so the seed is the claims' unit."""
    return make_runs(tmp_path / "runs")


@pytest.fixture
def runs_order(tmp_path):
    """The same numbers drawn per (order, seed) (data.draw=order): every pair is a unit."""
    return make_runs(tmp_path / "runs_order", draw="order")


def table_rows(md: str, title: str) -> dict[str, list[str]]:
    """{first cell: other cells} of the markdown table under ``## title``."""
    section = md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out[cells[0]] = cells[1:]
    return out


# --------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("df, t", [(1, 12.706), (2, 4.303), (4, 2.776), (8, 2.306), (29, 2.045), (10**7, 1.960)])
def test_t_quantile_known_values(df, t):
    assert t_ppf(0.975, df) == pytest.approx(t, abs=5e-4)
    assert t_cdf(t_ppf(0.975, df), df) == pytest.approx(0.975, abs=1e-10)
    assert t_ppf(0.025, df) == pytest.approx(-t, abs=5e-4)


def test_incomplete_beta_and_t_cdf():
    assert betainc(2, 3, 0.4) == pytest.approx(0.5248, abs=1e-12)  # 1 - sum of binomial terms, exact
    assert betainc(1, 1, 0.3) == pytest.approx(0.3, abs=1e-14)
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)  # Cauchy: 1/2 + atan(1)/pi
    assert t_cdf(-2.0, 5) == pytest.approx(0.0509697394, abs=1e-9)


def test_paired_interval_hand_computed():
    res = paired([1.0, 2.0, 3.0, 4.0])
    sd = math.sqrt(5 / 3)
    assert (res.n, res.mean, res.sd) == (4, 2.5, pytest.approx(sd))
    assert res.sd == pytest.approx(1.291, abs=1e-3)
    half = t_ppf(0.975, 3) * sd / 2
    assert t_ppf(0.975, 3) == pytest.approx(3.182, abs=1e-3)
    assert (res.lo, res.hi) == (pytest.approx(2.5 - half), pytest.approx(2.5 + half))
    assert (round(res.lo, 3), round(res.hi, 3)) == (0.446, 4.554)
    assert verdict(res)[0] == "shown"
    assert verdict(res, higher_is_better=False)[0] == "contradicted"


def test_verdicts():
    assert verdict(paired([-1.0, 2.0, 0.5]))[0] == "not shown"  # interval contains 0
    assert verdict(paired([-1.0, 2.0, 0.5]))[1] == "the interval contains 0"
    assert verdict(paired([-4.0, -3.0, -5.0]))[0] == "contradicted"
    assert verdict(paired([-4.0, -3.0, -5.0]), higher_is_better=False)[0] == "shown"
    one = paired([3.0])
    assert (one.n, one.mean, one.lo) == (1, 3.0, None)
    assert verdict(one) == ("not shown", "n=1: an interval needs at least two pairs")
    assert verdict(paired([]))[0] == "not shown"


# --------------------------------------------------------------------------- tables


def test_main_table_cells_and_benchmark_averages(runs):
    rep = paper_report([runs])
    md = rep.markdown()
    main_rows = table_rows(md, "Main table")
    assert main_rows["method"] == ["Order-1", "Order-2", "Order-4", "Standard CL avg (1, 2)", "LNT avg (4)", "All avg"]
    # seq_lora: order 1 {40, 44}, order 2 {50, 52}, order 4 {30, 35}; sample std (ddof=1)
    # Standard CL avg = (42 + 51) / 2 = 46.5, per seed (45, 48) -> sd 2.12; LNT 32.5 ± 3.54
    # All = (46.5 + 32.5) / 2 = 39.5, per seed (37.5, 41.5) -> sd 2.83
    assert main_rows["seq_lora"] == ["42.0 ± 2.8", "51.0 ± 1.4", "32.5 ± 3.5", "46.5 ± 2.1", "32.5 ± 3.5", "39.5 ± 2.8"]
    # slow: 62 ± 2.8, 71 ± 1.4, 52 ± 2.8; SCL 66.5 (per seed 65, 68); All (66.5 + 52) / 2 = 59.25
    assert main_rows["slow_surprise"][:5] == ["62.0 ± 2.8", "71.0 ± 1.4", "52.0 ± 2.8", "66.5 ± 2.1", "52.0 ± 2.8"]
    assert main_rows["slow_surprise"][5].startswith("59.2")
    # the fast row comes from results["fast"] of the same runs
    assert main_rows["slow_surprise (fast)"] == ["56.0 ± 1.4", "66.0 ± 0.0", "46.0 ± 1.4", "61.0 ± 0.7", "46.0 ± 1.4", "53.5 ± 1.1"]
    assert list(main_rows)[1:] == ["seq_lora", "slow_surprise", "slow_surprise (fast)"]
    assert "missing" not in md.split("## Missing runs")[0].lower()
    # CSV of the main table
    table = list(csv.DictReader(io.StringIO(rep.tables[0].csv)))
    seq = next(r for r in table if r["row"] == "seq_lora")
    assert float(seq["standard_cl_avg_mean"]) == pytest.approx(46.5)
    assert float(seq["all_avg_std"]) == pytest.approx(math.sqrt(8))
    assert (seq["order_1_n"], seq["order_1_complete"]) == ("2", "1")
    assert float(seq["lnt_avg_mean"]) == pytest.approx(32.5)


def test_no_fast_hides_fast_rows_and_metric_choice(runs):
    md = paper_report([runs], fast=False).markdown()
    assert "slow_surprise (fast) |" not in md.split("## Claims")[0]
    ap = table_rows(paper_report([runs], metric="ap").markdown(), "Main table")
    assert ap["slow_surprise (fast)"][0] == "85.0 ± 0.0"
    with pytest.raises(SureclError, match="unknown metric"):
        paper_report([runs], metric="accuracy")


def test_full_benchmark_header_and_varying_seed_counts(tmp_path):
    root = tmp_path / "r"
    for o in ("1", "2", "3"):
        put(root, "seq_lora", o, 0, 40.0 + int(o), 80.0)
        put(root, "seq_lora", o, 1, 42.0 + int(o), 80.0)
    put(root, "seq_lora", "1", 2, 50.0, 80.0)
    plan_runs = [{"row": "seq_lora", "order": o, "seed": s, "path": rel("seq_lora", o, s)} for o in ("1", "2", "3") for s in (0, 1)]
    plan_runs.append({"row": "seq_lora", "order": "1", "seed": 2, "path": rel("seq_lora", "1", 2)})
    write_sweep_plan(root, plan_runs)
    rows = table_rows(paper_report([root]).markdown(), "Main table")
    assert rows["method"] == ["Order-1", "Order-2", "Order-3", "Standard CL avg"]  # no LNT, no All
    # order 1 has 3 seeds, the others 2: n is shown; the average's ± runs over seeds 0, 1
    assert rows["seq_lora"][0] == "44.7 ± 4.7 (n=3)"  # 41, 43, 50
    assert rows["seq_lora"][1] == "43.0 ± 1.4 (n=2)"
    # its mean is over the per-order means (seed 2's run too), its ± over the 2 seeds in every order: both said
    assert rows["seq_lora"][3] == "43.9 ± 1.4 (n=2; mean over 3 seeds)" and "†" not in rows["seq_lora"][3]
    head = paper_report([root]).markdown().split("## ")[0]
    assert "orders 1, 2, 3, seeds 0, 1, 2." in head
    # a seed the sweep plans but no run has yet is named apart (a study still running)
    write_sweep_plan(root, [{"row": "seq_lora", "order": "1", "seed": 3, "path": rel("seq_lora", "1", 3)}])
    head = paper_report([root]).markdown().split("## ")[0]
    assert "orders 1, 2, 3, seeds 0, 1, 2 (planned: 3)." in head


def test_forgetting_table(runs):
    rep = paper_report([runs])
    rows = table_rows(rep.markdown(), "Forgetting")
    assert rows["method"] == ["Standard CL AP", "Standard CL FP", "Standard CL forgetting", "LNT AP", "LNT FP", "LNT forgetting"]
    assert rows["seq_lora"] == ["80.0", "46.5", "33.5", "80.0", "32.5", "47.5"]
    assert rows["slow_surprise"] == ["90.0", "66.5", "23.5", "90.0", "52.0", "38.0"]
    assert rows["slow_surprise (fast)"] == ["85.0", "61.0", "24.0", "85.0", "46.0", "39.0"]
    assert "AP − FP" in rep.tables[1].markdown
    table = list(csv.DictReader(io.StringIO(rep.tables[1].csv)))
    assert float(next(r for r in table if r["row"] == "seq_lora")["lnt_forgetting_mean"]) == pytest.approx(47.5)


def test_ablation_table_and_png(tmp_path):
    root = tmp_path / "abl"
    fps = {"100": (50.0, 54.0), "300": (60.0, 62.0), "1000": (70.0, 76.0)}
    for size, (a, b) in fps.items():
        row = f"slow_surprise replay.buffer_size={size}"
        for order, shift in (("1", 0.0), ("4", 10.0)):
            put(root, row, order, 0, a + shift, 90.0, fast=(a + shift - 5, 85.0))
            put(root, row, order, 1, b + shift, 90.0, fast=(b + shift - 5, 85.0))
    put(root, "seq_lora", "1", 0, 40.0, 80.0)  # a row without grid values: not in the ablation
    put(root, "seq_lora", "1", 1, 40.0, 80.0)
    put(root, "seq_lora", "4", 0, 40.0, 80.0)
    put(root, "seq_lora", "4", 1, 40.0, 80.0)
    rep = paper_report([root])
    abl = next(t for t in rep.tables if t.name == "ablation_replay.buffer_size")
    rows = table_rows(f"## {abl.title}\n" + abl.markdown, abl.title)
    assert rows["replay.buffer_size"] == ["slow_surprise", "slow_surprise (fast)"]
    assert list(rows)[1:] == ["100", "300", "1000"]  # numeric order
    # buffer 100: values {50, 54, 60, 64} over orders and seeds: mean 57, sample sd 6.22
    assert rows["100"] == ["57.0 ± 6.2", "52.0 ± 6.2"]
    assert rows["1000"][0] == f"78.0 ± {math.sqrt(((70 - 78) ** 2 + (76 - 78) ** 2 + (80 - 78) ** 2 + (86 - 78) ** 2) / 3):.1f}"
    assert abl.png[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "out"
    rep.write(out)
    import matplotlib.image

    img = matplotlib.image.imread(out / "ablation_replay.buffer_size.png")
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert (out / "ablation_replay.buffer_size.md").read_text().count("| 300 |") == 1
    assert "![Ablation: replay.buffer_size](ablation_replay.buffer_size.png)" in (out / "report.md").read_text()
    table = list(csv.reader(open(out / "ablation_replay.buffer_size.csv")))
    assert table[0][:3] == ["replay.buffer_size", "slow_surprise mean", "slow_surprise std"]
    assert [r[0] for r in table[1:]] == ["100", "300", "1000"]


# --------------------------------------------------------------------------- missing runs


def test_planned_run_without_results_is_flagged_and_named(runs):
    plan = [{"row": row, "method": row, "grid": {}, "order": o, "seed": s, "dual": row == "slow_surprise", "path": rel(row, o, s)}
            for row in ("seq_lora", "slow_surprise") for o in ("1", "2", "4") for s in (0, 1)]
    write_sweep_plan(runs, plan)
    shutil.rmtree(runs / rel("slow_surprise", "2", 1))  # planned, never finished
    rep = paper_report([runs])
    md = rep.markdown()
    rows = table_rows(md, "Main table")
    # order 2 has seed 0 only (70.0): shown with a dagger, not silently averaged
    assert rows["slow_surprise"][1] == "70.0 (n=1) †"
    assert rows["slow_surprise"][3].endswith("†")  # Standard CL avg needs it
    assert rows["slow_surprise"][4] == "52.0 ± 2.8 (n=2)"  # LNT is complete
    assert rows["slow_surprise (fast)"][1].endswith("†")
    assert "†" not in " ".join(rows["seq_lora"])
    assert "**1 expected run(s) missing**" in md
    under_main = md.split("## Forgetting")[0]  # both affected rows named under the table
    assert "slow_surprise order 2 seed 1; slow_surprise (fast) order 2 seed 1" in under_main
    missing = table_rows(md, "Missing runs")
    assert missing["slow_surprise (and its fast row)"] == ["2", "1", str(runs / rel("slow_surprise", "2", 1)), "no results.json"]
    assert len(missing) == 2  # header + the one run
    main_csv = list(csv.DictReader(io.StringIO(rep.tables[0].csv)))
    slow = next(r for r in main_csv if r["row"] == "slow_surprise")
    assert (slow["order_2_n"], slow["order_2_complete"], slow["order_1_complete"]) == ("1", "0", "1")


def test_cell_without_runs_shows_dash_and_is_listed(runs):
    plan = [{"row": "seq_lora", "order": o, "seed": s, "path": rel("seq_lora", o, s)} for o in ("1", "2", "4", "5") for s in (0, 1)]
    write_sweep_plan(runs, plan)
    md = paper_report([runs]).markdown()
    rows = table_rows(md, "Main table")
    assert rows["method"][3] == "Order-5"
    assert rows["seq_lora"][3] == "-"
    assert rows["slow_surprise"][3] == "-"  # not planned for this row: no runs, said under the table
    assert rows["seq_lora"][5].endswith("†")  # LNT avg over 4 and 5 lacks order 5
    missing = table_rows(md, "Missing runs")
    assert missing["seq_lora"][:2] == ["5", "1"] or missing["seq_lora"][:2] == ["5", "0"]
    assert "seq_lora order 5 seed 0" in md and "seq_lora order 5 seed 1" in md
    assert 'Cells "-" have no runs at all: slow_surprise Order-5' in md


def test_holes_inferred_without_plan(runs):
    (runs / rel("seq_lora", "4", 1) / "results.json").unlink()
    md = paper_report([runs]).markdown()
    rows = table_rows(md, "Main table")
    assert rows["seq_lora"][2] == "30.0 (n=1) †"
    missing = table_rows(md, "Missing runs")
    assert missing["seq_lora"] == ["4", "1", "-", "no results.json"]
    assert "every (row x order x seed) combination seen" in md


def test_dual_run_without_fast_section_is_flagged(runs):
    path = runs / rel("slow_surprise", "1", 0) / "results.json"
    res = json.loads(path.read_text())
    del res["fast"]
    path.write_text(json.dumps(res))
    md = paper_report([runs]).markdown()
    assert table_rows(md, "Main table")["slow_surprise (fast)"][0] == "57.0 (n=1) †"
    assert table_rows(md, "Missing runs")["slow_surprise (fast)"][3] == "results.json has no 'fast' section"


def test_write_sweep_plan_merges(tmp_path):
    write_sweep_plan(tmp_path, [{"row": "a", "order": "1", "seed": 0, "path": "a/order1/seed0"}])
    write_sweep_plan(tmp_path, [{"row": "a", "order": "2", "seed": 0, "path": "a/order2/seed0"}])
    plan = json.loads((tmp_path / PLAN_FILE).read_text())
    assert plan["kind"] == "surecl-sweep-plan"
    assert [r["path"] for r in plan["runs"]] == ["a/order1/seed0", "a/order2/seed0"]
    (tmp_path / PLAN_FILE).write_text("[]")
    (tmp_path / ".surecl-sweep-lock").unlink()
    with pytest.raises(SureclError, match="not a surecl sweep plan"):
        write_sweep_plan(tmp_path, [])
    assert not (tmp_path / ".surecl-sweep-lock").exists()  # a refused sweep leaves the folder as it was


@pytest.mark.parametrize("plan, words", [
    ({"order_benchmark": ["Standard CL"]}, "'order_benchmark' must map"),
    ({"order_benchmark": {"1": ["Standard CL"]}}, "'order_benchmark' must map"),
    ({"runs": [{"row": "seq_lora", "order": "1", "seed": 0, "path": 7}]}, "path must be a name"),
    ({"runs": [{"row": ["seq_lora"], "order": "1", "seed": 0, "path": "seq_lora/order-1/seed0"}]}, "row must be a name"),
    ({"runs": [{"row": "seq_lora", "order": {}, "seed": None, "path": "x"}]}, "order and seed must be a name"),
])
def test_a_sweep_plan_of_types_surecl_never_writes_is_one_line(runs, capsys, plan, words):
    """A sweep.json edited by hand (or damaged): the paper report and a sweep into the folder
    stop with one line naming the field, not with a traceback."""
    (runs / PLAN_FILE).write_text(json.dumps({"kind": "surecl-sweep-plan", "format": 1, "runs": [], **plan}))
    assert main(["report", str(runs), "--layout", "paper"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "sweep.json" in err[0], err
    with pytest.raises(SureclError, match=words.replace("'", ".")):
        write_sweep_plan(runs, [])


def test_two_sweeps_planning_at_once_keep_each_others_runs(tmp_path, monkeypatch):
    """Two sweeps into one folder read, merge and replace sweep.json at the same moment: the
    plan lock serialises them, so the runs of both are planned (without it the later write
    drops the earlier one's run)."""
    import threading
    import time

    from surecl import report

    write_sweep_plan(tmp_path, [{"row": "a", "order": "1", "seed": 0, "path": "a/order1/seed0"}])
    real = report.read_plan

    def slow(path):  # both would read the one-run plan before either writes
        got = real(path)
        time.sleep(0.3)
        return got

    monkeypatch.setattr(report, "read_plan", slow)
    errors = []

    def plan(seed):
        try:
            write_sweep_plan(tmp_path, [{"row": "a", "order": "1", "seed": seed, "path": f"a/order1/seed{seed}"}])
        except Exception as e:  # pragma: no cover - shown by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=plan, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    runs = json.loads((tmp_path / PLAN_FILE).read_text())["runs"]
    assert sorted(r["path"] for r in runs) == ["a/order1/seed0", "a/order1/seed1", "a/order1/seed2"]


# --------------------------------------------------------------------------- claims


def test_default_claims(runs_order):
    """Independent draws (data.draw=order): every (order, seed) pair is a unit."""
    rep = paper_report([runs_order])
    assert rep.claims == [("slow_surprise", "slow_surprise (fast)"), ("slow_surprise", "seq_lora")]
    claims = next(t for t in rep.tables if t.name == "claims")
    rows = [r for r in csv.DictReader(io.StringIO(claims.csv))]
    by = {(r["claim"], r["benchmark"]): r for r in rows}
    # slow - fast on Standard CL: o1 {5, 7}, o2 {4, 6} -> mean 5.5, sd 1.291, CI 5.5 ± 3.182 * 1.291 / 2
    scl = by[("slow_surprise > slow_surprise (fast)", "Standard CL")]
    assert (int(scl["n"]), float(scl["mean_diff"]), scl["verdict"], scl["unit"]) == (4, 5.5, "shown", "order_seed")
    assert float(scl["ci_lo"]) == pytest.approx(5.5 - t_ppf(0.975, 3) * math.sqrt(5 / 3) / 2)
    t = 5.5 / (math.sqrt(5 / 3) / 2)
    assert float(scl["t_stat"]) == pytest.approx(t, abs=1e-5)
    assert float(scl["t_p"]) == pytest.approx(2 * (1 - t_cdf(t, 3)), abs=1e-6)
    # Holm over every tested row of the table (both claims in Standard CL, LNT and all), by hand:
    # p-values sorted, the j-th (from 0) times (m - j), then the running maximum
    raw = [(r["claim"], r["benchmark"], float(r["t_p"])) for r in rows if r["t_p"] != ""]
    # slow_surprise - seq_lora on Standard CL is 20 at every unit: no spread, so no t-test (it
    # would be t = inf, p = 0, "shown" from any two units) and not in Holm's family
    flat = by[("slow_surprise > seq_lora", "Standard CL")]
    assert (flat["t_p"], flat["holm_p"], flat["verdict"], float(flat["mean_diff"])) == ("", "", "not shown", 20.0)
    assert flat["why"].startswith("every difference equal: no spread")
    assert len(raw) == 5 and all(r["holm_family"] == "5" for r in rows if r["t_p"] != "")
    adjusted, running = {}, 0.0
    for j, (claim, bench, p) in enumerate(sorted(raw, key=lambda x: x[2])):
        running = max(running, min(1.0, (len(raw) - j) * p))
        adjusted[(claim, bench)] = running
    for r in rows:
        if r["t_p"] != "":
            assert float(r["holm_p"]) == pytest.approx(adjusted[(r["claim"], r["benchmark"])], abs=1e-5)
    assert (scl["sign_wins"], scl["sign_losses"], float(scl["sign_p"])) == ("4", "0", 0.125)  # 2 / 2^4
    # LNT: {5, 7}, n = 2: t = 6 on 1 df, p = 0.1051 -> not shown
    lnt = by[("slow_surprise > slow_surprise (fast)", "LNT")]
    assert (lnt["n"], lnt["verdict"]) == ("2", "not shown")
    assert float(lnt["t_p"]) == pytest.approx(1 - 2 * math.atan(6) / math.pi, abs=1e-6)  # Cauchy tail
    assert lnt["why"].startswith("Holm p 0.105 >= 0.05")
    assert by[("slow_surprise > slow_surprise (fast)", "all")]["n"] == "6"
    assert by[("slow_surprise > seq_lora", "all")]["verdict"] == "shown"
    md = rep.markdown()
    section = md.split("## Claims")[1]
    assert "higher is better" in section and "unit: (order, seed) (independent data draws, data.draw=order; the runs of one seed share" in section
    assert "Verdicts use Holm-adjusted p-values at 0.05" in section
    assert "**shown**" in md and "not shown (Holm p 0.105 >= 0.05)" in md
    cells = table_rows(md, "Claims (FP, paired)")
    assert cells["claim"] == ["benchmark", "n units", "mean diff (A − B)", "95 % t-interval", "t p (raw)", "Holm p",
                              "sign test (W/L, p)", "verdict", "hosts"]


def test_dual_grid_rows_get_a_slow_over_fast_claim(runs):
    put(runs, "slow_surprise dual.beta=auto", "1", 0, 61.0, 90.0, fast=(55.0, 85.0))
    put(runs, "slow_surprise train.batching=bucketed", "1", 0, 61.0, 90.0, fast=(55.0, 85.0))
    claims = paper_report([runs]).claims
    assert ("slow_surprise dual.beta=auto", "slow_surprise dual.beta=auto (fast)") in claims
    assert not any(a.startswith("slow_surprise train.batching") for a, _ in claims)


def test_surprise_vs_reservoir_uses_fast_rows_and_forgetting_direction(tmp_path):
    root = tmp_path / "r"
    for s, (a, b) in enumerate([(60.0, 55.0), (61.0, 57.0), (59.0, 54.5)]):
        put(root, "slow_surprise", "1", s, a + 3, 90.0, fast=(a, 90.0))
        put(root, "slow_reservoir", "1", s, b + 3, 90.0, fast=(b, 90.0))
    rep = paper_report([root], metric="forgetting")
    assert ("slow_surprise (fast)", "slow_reservoir (fast)") in rep.claims
    claims = next(t for t in rep.tables if t.name == "claims")
    assert "lower is better" in claims.markdown and "lies below 0" in claims.markdown
    by = {r["claim"]: r for r in csv.DictReader(io.StringIO(claims.csv))}
    # forgetting = 90 - FP, so surprise forgets 5, 4, 4.5 points less: CI -4.5 ± 4.303 * 0.5 / sqrt(3), below 0
    row = by["slow_surprise (fast) > slow_reservoir (fast)"]
    assert float(row["mean_diff"]) == pytest.approx(-4.5)
    assert row["verdict"] == "shown"


def test_custom_claims_and_errors(runs):
    rep = paper_report([runs], claims="none", custom_claims=["seq_lora > slow_surprise", "slow_surprise (fast)<slow_surprise"])
    assert rep.claims == [("seq_lora", "slow_surprise"), ("slow_surprise", "slow_surprise (fast)")]
    by = {(r["claim"], r["benchmark"]): r["verdict"] for r in csv.DictReader(io.StringIO(next(t for t in rep.tables if t.name == "claims").csv))}
    assert by[("seq_lora > slow_surprise", "all")] == "contradicted"
    rows = Study.load([runs]).rows
    for bad, words in [("seq_lora", "must look like"), ("a>b>c", "must look like"), (">seq_lora", "name a row"),
                       ("nope>seq_lora", "no row 'nope'"), ("seq_lora>seq_lora", "itself")]:
        with pytest.raises(SureclError, match=words):
            parse_claim(bad, rows)


def test_claims_count_pairs_on_one_host(tmp_path):
    """A pair whose two runs recorded different hosts is two independent runs, not one trajectory:
    the claims table says how many pairs share a host, and which runs recorded none."""
    machine_a = {"cpu": "Xeon", "cpu_flags": ["avx2", "avx512f", "avx512_bf16", "amx_bf16"], "threads": 1, "torch": "2.13.0"}
    machine_b = {"cpu": "EPYC", "cpu_flags": ["avx2"], "threads": 2, "torch": "2.13.0"}
    root = tmp_path / "r"
    # seed 0: both on A; seed 1: seq_lora on B; seed 2: seq_lora recorded no host
    for seed, seq_host in [(0, machine_a), (1, machine_b), (2, None)]:
        for row, fp, host, dtype in [("slow_surprise", 70.0 + seed, machine_a, "bfloat16"), ("seq_lora", 60.0, seq_host, "float32")]:
            d = put(root, row, "1", seed, fp, 90.0, fast=(65.0, 88.0) if row == "slow_surprise" else None)
            res = json.loads((d / "results.json").read_text())
            if host is not None:
                res["host"], res["base_dtype"] = host, dtype if host is machine_b else "bfloat16"
            (d / "results.json").write_text(json.dumps(res))
    rep = paper_report([root], claims="none", custom_claims=["slow_surprise>seq_lora", "slow_surprise>slow_surprise (fast)"])
    table = next(t for t in rep.tables if t.name == "claims")
    by = {r["claim"]: r for r in csv.DictReader(io.StringIO(table.csv))}
    cross = by["slow_surprise > seq_lora"]
    assert (cross["n"], cross["same_host"], cross["other_host"], cross["host_unrecorded"]) == ("3", "1", "1", "1")
    cells = table_rows(rep.markdown(), "Claims (FP, paired)")
    # fewer than 3 same-host units: all units, the cross-host ones counted
    assert cells["slow_surprise > seq_lora"][-1] == "cross-host units: 1, unrecorded: 1"
    assert (cross["host_basis"], cross["n_all"]) == ("all", "3")
    assert cells["slow_surprise > slow_surprise (fast)"][-1] == "same-host units only: 3 of 3"
    own = by["slow_surprise > slow_surprise (fast)"]  # a dual run's two adapters: one trajectory
    assert (own["same_host"], own["other_host"], own["host_unrecorded"]) == ("3", "0", "0")
    for seed in range(3):  # even where the run recorded no host
        f = root / rel("slow_surprise", "1", seed) / "results.json"
        f.write_text(json.dumps({k: v for k, v in json.loads(f.read_text()).items() if k != "host"}))
    rep = paper_report([root], claims="none", custom_claims=["slow_surprise>slow_surprise (fast)", "slow_surprise>seq_lora"])
    by = {r["claim"]: r for r in csv.DictReader(io.StringIO(next(t for t in rep.tables if t.name == "claims").csv))}
    assert by["slow_surprise > slow_surprise (fast)"]["same_host"] == "3"
    assert (by["slow_surprise > seq_lora"]["same_host"], by["slow_surprise > seq_lora"]["host_unrecorded"]) == ("0", "3")


def test_host_key_keeps_what_changes_the_numbers():
    a = {"host": {"cpu": "Xeon", "cpu_flags": ["avx2", "avx512f", "avx512_bf16"], "threads": 2, "torch": "2.13.0"}, "base_dtype": "bfloat16"}
    same_kernels = {"host": {**a["host"], "cpu_flags": ["avx512_bf16", "avx512f", "avx2"], "threads": 1}, "base_dtype": "bfloat16"}
    assert host_key(a) == host_key({**a, "host": {**a["host"], "cpu_flags": ["avx512_bf16", "avx512f", "avx2"]}})  # flags in any order
    assert host_key(a) != host_key(same_kernels)  # a CPU run's thread count is kept apart (unmeasured on bf16 hosts)
    gpu = {"host": {**a["host"], "gpu": "NVIDIA H100"}, "base_dtype": "bfloat16"}
    assert host_key(gpu) == host_key({**gpu, "host": {**gpu["host"], "threads": 4}})  # a GPU run's CPU threads do not count
    assert host_key(a) != host_key({**a, "base_dtype": "float32"})
    assert host_key(a) != host_key({"host": {**a["host"], "cpu_flags": ["avx2"]}, "base_dtype": "bfloat16"})
    assert host_key(a) != host_key({"host": {**a["host"], "gpu": "NVIDIA H100"}, "base_dtype": "bfloat16"})
    assert host_key(a) != host_key({"host": {**a["host"], "cpu_flags": ["avx2", "avx512_bf16"]}, "base_dtype": "bfloat16"})  # no AVX-512F
    assert host_key(a) != host_key({"host": {**a["host"], "torch": "2.11.0"}, "base_dtype": "bfloat16"})
    assert host_key({"base_dtype": "bfloat16"}) is None


def test_a_run_resumed_on_another_machine_names_both(tmp_path, tiny_cache, monkeypatch):
    """results.json ``hosts`` lists every machine a run ran on, so its host key is not the last
    machine's alone; the same machine again adds nothing."""
    import surecl.run_folder as run_folder  # opening the folder adds the machine to hosts
    import surecl.trainer as trainer

    small = ["train.epochs=1", "data.n_train=16", "data.n_test=8", "data.tasks=[colors,animals]"]
    real = run_folder.host_info
    monkeypatch.setattr(run_folder, "host_info", lambda dev: {**real(dev), "cpu": "Machine X", "cpu_flags": ["avx512_bf16"]})
    out = tmp_path / "run"
    first = trainer.run(build_config("tiny,surprise", small), out, progress=False, cache_dir=tiny_cache)
    assert [h["cpu"] for h in first["hosts"]] == ["Machine X"]
    (out / "results.json").unlink()  # run again in the folder: it resumes from the last checkpoint
    monkeypatch.setattr(run_folder, "host_info", real)
    again = trainer.run(build_config("tiny,surprise", small), out, progress=False, cache_dir=tiny_cache)
    assert again["accuracy_matrix"] == first["accuracy_matrix"]
    assert [h["cpu"] for h in again["hosts"]] == ["Machine X", real(torch.device("cpu"))["cpu"]]
    assert again["host"] == again["hosts"][-1]
    assert host_key(again).startswith("Machine X [avx512_bf16] torch ") and " then " in host_key(again) and host_key(again) != host_key(first)
    assert "earlier parts ran on Machine X" in (out / "report.md").read_text()
    (out / "results.json").unlink()
    third = trainer.run(build_config("tiny,surprise", small), out, progress=False, cache_dir=tiny_cache)
    assert len(third["hosts"]) == 2


def test_n1_claim_not_shown(tmp_path):
    root = tmp_path / "r"
    put(root, "slow_surprise", "1", 0, 70.0, 90.0, fast=(60.0, 85.0))
    rep = paper_report([root])
    md = rep.markdown()
    assert "not shown (n=1: a t-test needs at least two units)" in md


# --------------------------------------------------------------------------- CLI


def test_cli_paper_layout_writes_files(runs, tmp_path, capsys):
    out = tmp_path / "paper"
    argv = ["report", str(runs), "--layout", "paper", "--out-dir", str(out), "--claim", "slow_surprise (fast)>seq_lora", "--md", str(tmp_path / "all.md")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for name in ("report.md", "main.md", "main.csv", "forgetting.md", "forgetting.csv", "claims.md", "claims.csv", "missing.md", "missing.csv", "timing.md", "timing.csv"):
        assert (out / name).is_file(), name
    assert "| seq_lora | 42.0 ± 2.8 |" in (out / "main.md").read_text()
    assert "slow_surprise (fast) > seq_lora" in (out / "claims.md").read_text()
    assert (tmp_path / "all.md").read_text().startswith("# surecl report: FP")
    assert "## Main table" in printed and "## Claims" in printed
    assert not list(out.glob("ablation_*"))
    # the default layout is unchanged
    assert main(["report", str(runs)]) == 0
    # the orders layout: the same sample std as the paper layout's main table
    assert "| seq_lora | 42.0 ± 2.8 | 51.0 ± 1.4 | 32.5 ± 3.5 | 41.8 ± 2.6 |" in capsys.readouterr().out


@pytest.mark.parametrize("extra, words", [
    (["--claim", "nope>seq_lora"], "no row 'nope'"),
    (["--claim", "seq_lora"], "must look like"),
    (["--metric", "accuracy"], "unknown metric"),
    (["--order-benchmark", "lnt8a"], "ORDER=BENCHMARK"),
])
def test_cli_bad_input_one_line_exit_2(runs, capsys, extra, words):
    assert main(["report", str(runs), "--layout", "paper", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("surecl: error: ") and err.count("\n") == 1 and words in err


def test_cli_errors_no_runs_and_mixed_kinds(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--layout", "paper"]) == 2
    assert "no results.json" in capsys.readouterr().err
    put(tmp_path / "mix", "seq_lora", "1", 0, 40.0, 80.0)
    put(tmp_path / "mix", "surprise", "1", 0, 12.0, 10.0, kind="perplexity")
    assert main(["report", str(tmp_path / "mix"), "--layout", "paper"]) == 2
    err = capsys.readouterr().err
    assert "scored in different metrics (accuracy: 1 run, e.g. " in err and "; perplexity: 1 run, e.g. " in err
    assert err.count("\n") == 1 and "Traceback" not in err
    # a generation stream (ROUGE-L) beside classification runs is refused the same way, in both layouts
    put(tmp_path / "gen", "seq_lora", "1", 0, 40.0, 80.0)
    put(tmp_path / "gen", "surprise", "1", 0, 30.0, 35.0, kind="rouge_l")
    put(tmp_path / "gen", "surprise", "1", 1, 31.0, 36.0, kind="rouge_l")
    for layout in ("paper", "orders"):
        assert main(["report", str(tmp_path / "gen"), "--layout", layout]) == 2
        err = capsys.readouterr().err
        assert "(accuracy: 1 run, e.g. " in err and "; rouge_l: 2 runs, e.g. " in err and "Traceback" not in err


def test_generation_runs_are_reported_in_their_metric(tmp_path, capsys):
    """Runs scored in ROUGE-L are reported as such (not as accuracy %), in both layouts."""
    for seed, fp in ((0, 30.0), (1, 34.0)):
        put(tmp_path / "gen", "seq_lora", "1", seed, fp, 40.0, kind="rouge_l")
        put(tmp_path / "gen", "surprise", "1", seed, fp + 5, 41.0, kind="rouge_l")
    assert main(["report", str(tmp_path / "gen")]) == 0
    out = capsys.readouterr().out
    assert "FP (ROUGE-L (F, x100), higher is better)" in out and "accuracy" not in out
    assert main(["report", str(tmp_path / "gen"), "--layout", "paper", "--out-dir", str(tmp_path / "rep")]) == 0
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "ROUGE-L (F, x100), higher is better" in report and "accuracy %" not in report


def test_two_runs_of_one_cell_are_an_error(runs, tmp_path):
    put(tmp_path / "other", "seq_lora", "1", 0, 41.0, 80.0)
    with pytest.raises(SureclError, match="two runs of row 'seq_lora', order 1, seed 0"):
        paper_report([runs, tmp_path / "other"])
    assert len(Study.load([runs, runs]).records) == 18  # the same folder twice is read once


def test_custom_order_benchmark(tmp_path, capsys):
    root = tmp_path / "r"
    for s in (0, 1):
        put(root, "seq_lora", "lnt8a", s, 30.0 + s, 80.0)
        put(root, "seq_lora", "4", s, 40.0 + s, 80.0)
    rows = table_rows(paper_report([root]).markdown(), "Main table")
    assert rows["method"] == ["Order-4", "lnt8a", "LNT avg (4)"]  # an unknown order belongs to no benchmark
    rows = table_rows(paper_report([root], order_benchmark={"lnt8a": "LNT"}).markdown(), "Main table")
    assert rows["method"][-1] == "LNT avg (4, lnt8a)" and rows["seq_lora"][-1] == "35.5 ± 0.7"


def test_perplexity_runs(tmp_path):
    root = tmp_path / "ppl"
    for s in range(4):
        put(root, "seq_lora", "default", s, 20.0 + s, 15.0, kind="perplexity")
        put(root, "slow_surprise", "default", s, 16.0 + 1.1 * s, 15.0, kind="perplexity")
    rep = paper_report([root], claims="none", custom_claims=["slow_surprise>seq_lora"])
    md = rep.markdown()
    assert "perplexity, lower is better" in md
    assert table_rows(md, "Main table")["seq_lora"] == ["21.50 ± 1.29"]
    by = {r["benchmark"]: r for r in csv.DictReader(io.StringIO(next(t for t in rep.tables if t.name == "claims").csv))}
    assert by["default" if "default" in by else "other"]["verdict"] == "shown"  # 3.7-4 points lower at every seed
    # the heatmaps' section says what their matrices hold, as the run's own report does
    shown = rep.markdown(images=True)
    assert "## Perplexity matrices" in shown and "Accuracy matrices" not in shown


def test_sweep_writes_plan_before_running(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "sw"
    argv = ["sweep", "--config", "tiny", "--methods", "seq_lora", "--orders", "default", "--seeds", "0,1", "--out", str(out), "--quiet", *SMALL]
    assert main(argv) == 0
    plan = json.loads((out / PLAN_FILE).read_text())
    assert [(r["row"], r["order"], r["seed"], r["path"], r["dual"]) for r in plan["runs"]] == [
        ("seq_lora", "default", 0, "seq_lora/orderdefault/seed0", False), ("seq_lora", "default", 1, "seq_lora/orderdefault/seed1", False)]
    assert all((out / r["path"] / "results.json").is_file() for r in plan["runs"])
    capsys.readouterr()
    shutil.rmtree(out / "seq_lora" / "orderdefault" / "seed1")
    assert main(["report", str(out), "--layout", "paper"]) == 0
    md = capsys.readouterr().out
    assert table_rows(md, "Missing runs")["seq_lora"] == ["default", "1", str(out / "seq_lora/orderdefault/seed1"), "no results.json"]
    assert table_rows(md, "Main table")["seq_lora"][0].endswith(" †")  # one seed of two
    assert main(["sweep", "--config", "tiny", "--seeds", "x", "--out", str(out)]) == 2


def mtl_run(root, order, seed, fp=70.0):
    """A one-stage run as MTL writes it: the matrix's last row alone, the stream metrics null."""
    d = put(root, "mtl", order, seed, fp, fp)
    r = json.loads((d / "results.json").read_text())
    r["accuracy_matrix"] = [[None, None], [fp, fp]]
    r.update(ap=None, forgetting=None, bwt=None, avg_incremental=None)
    (d / "results.json").write_text(json.dumps(r))
    return d


def test_a_one_stage_runs_stream_metrics_are_not_missing(runs, capsys):
    """MTL's AP, forgetting and BWT are null by design: not missing runs, no † on its cells, no
    claim computed from its one filled row (it was counted missing in every paper report with MTL)."""
    for order in ("1", "2", "4"):
        for seed in (0, 1):
            mtl_run(runs, order, seed)
    st = Study.load([runs])
    assert st.missing("forgetting") == [] and st.missing("fp") == []
    assert st.order_cell("mtl", "1", "forgetting").incomplete is False and st.order_cell("mtl", "1", "fp").mean == 70.0
    assert st.claim_value(("mtl", "1", 0), "forgetting") is None and st.claim_value(("mtl", "1", 0), "fp") == 70.0
    assert main(["report", str(runs), "--layout", "paper", "--metric", "forgetting"]) == 0
    out = capsys.readouterr().out
    assert "expected run(s) missing" not in out and "None: every expected run is present." in out
    assert "mtl order 1" not in out  # no footer naming its null forgetting as a missing value
    (runs / "mtl" / "order1" / "seed1" / "results.json").unlink()
    assert [(m.row, m.order, m.seed) for m in Study.load([runs]).missing("forgetting")] == [("mtl", "1", 1)]  # a run that is absent still is


def test_mean_matrix_and_heatmap_panels(runs, tmp_path):
    st = Study.load([runs])
    # order 1: seq_lora seeds FP 40 and 44, AP 80 -> mean matrix [[80, -], [42, 80]]
    tasks, mat, n = st.mean_matrix("seq_lora", "1")
    assert tasks == ["a", "b"] and n == 2 and mat == [[80.0, None], [42.0, 80.0]]
    # the fast rows have their own matrices (slow_surprise's fast FP 55 and 57 on order 1)
    assert st.mean_matrix("slow_surprise (fast)", "1")[1][1][0] == 56.0
    assert st.mean_matrix("seq_lora", "nope") is None
    # a one-stage run (its last row alone, as MTL writes) has no square matrix to draw
    mtl_run(runs, "1", 0)
    st = Study.load([runs])
    assert st.mean_matrix("mtl", "1") is None
    rep = paper_report([runs])
    stems = [stem for stem, _, _ in rep.heatmaps]
    assert stems == ["heatmap_1", "heatmap_2", "heatmap_4"]
    assert "Not drawn (one-stage runs, or seeds with different task lists): mtl." in rep.heatmaps[0][1]
    assert "Not drawn" not in rep.heatmaps[1][1]
    assert all(png.startswith(b"\x89PNG") for _, _, png in rep.heatmaps)
    out = tmp_path / "paper"
    assert main(["report", str(runs), "--layout", "paper", "--out-dir", str(out)]) == 0
    assert (out / "heatmap_1.png").read_bytes().startswith(b"\x89PNG")
    assert "![heatmap_2](heatmap_2.png)" in (out / "report.md").read_text()


def test_out_dir_replaces_only_what_an_earlier_report_wrote(tmp_path, capsys):
    """A user's file where the report writes is refused before anything is written; the
    report's own files are replaced on the next run (they are listed in the folder's mark),
    as in a folder a version before the mark wrote."""
    from surecl.report import REPORT_MARK

    runs = tmp_path / "runs"
    for seed in (0, 1):
        put(runs, "seq_lora", "1", seed, 60.0 + seed, 50.0)
        put(runs, "surprise", "1", seed, 70.0 + seed, 65.0)
    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    (out / "main.csv").write_text("my,data")
    assert main(["report", str(runs), "--layout", "paper", "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was not written by surecl report" in err[-1]
    assert (out / "report.md").read_text() == "my notes" and (out / "main.csv").read_text() == "my,data"
    assert sorted(p.name for p in out.iterdir()) == ["main.csv", "report.md"]  # nothing else written either
    fresh = tmp_path / "fresh"
    assert main(["report", str(runs), "--layout", "paper", "--out-dir", str(fresh)]) == 0
    assert (fresh / "report.md").read_text().startswith("# surecl report")
    listed = set(json.loads((fresh / REPORT_MARK).read_text())["files"])
    assert {"report.md", "main.md", "main.csv"} <= listed
    (fresh / "main.csv").write_text("stale")
    assert main(["report", str(runs), "--layout", "paper", "--out-dir", str(fresh)]) == 0  # its own files: replaced
    assert (fresh / "main.csv").read_text() != "stale"
    (fresh / REPORT_MARK).unlink()  # a folder written before the mark: its report.md is a surecl report
    assert main(["report", str(runs), "--layout", "paper", "--out-dir", str(fresh)]) == 0
    # ... which vouches for its own tables and images only: a report.md printed by the report
    # (> tables/report.md) beside a user's main.csv and claims.md claims neither of them
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "main.csv").write_text("my,hand,made")
    (tables / "claims.md").write_text("my paper notes")
    capsys.readouterr()
    assert main(["report", str(runs), "--layout", "paper"]) == 0
    (tables / "report.md").write_text(capsys.readouterr().out)
    assert (tables / "report.md").read_text().startswith("# surecl report")
    assert main(["report", str(runs), "--layout", "paper", "--out-dir", str(tables)]) == 2
    assert "was not written by surecl report" in capsys.readouterr().err
    assert (tables / "main.csv").read_text() == "my,hand,made" and (tables / "claims.md").read_text() == "my paper notes"
    assert not (tables / REPORT_MARK).exists()
    (tmp_path / "a-file").write_text("mine")
    assert main(["report", str(runs), "--layout", "paper", "--out-dir", str(tmp_path / "a-file")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"--out-dir: {tmp_path / 'a-file'} is a file, not a directory")  # the flag given


def test_footer_names_at_most_limit_empty_cells():
    from surecl.report import _footer

    text = _footer([], [f"row{i} s1" for i in range(35)], limit=30)
    assert "row29 s1; … and 5 more." in text and "row30 s1" not in text


def test_timing_table_totals_per_benchmark_and_host(tmp_path):
    """The study's time per (benchmark, host): a dual run counts once, a run without timing is
    counted but not timed, and thread-hours use the run's own thread count."""
    root = tmp_path / "runs"
    machine_a = {"cpu": "Xeon", "cpu_flags": ["avx512_bf16"], "threads": 2, "torch": "2.13.0"}
    machine_b = {"cpu": "EPYC", "cpu_flags": ["avx2"], "threads": 1, "torch": "2.13.0"}
    spec = [("seq_lora", "1", 0, machine_a, 600.0), ("slow_surprise", "1", 0, machine_a, 1000.0),
            ("seq_lora", "2", 0, machine_b, 1800.0), ("slow_surprise", "2", 0, machine_b, 3600.0),
            ("seq_lora", "4", 0, machine_b, 7200.0), ("slow_surprise", "4", 0, machine_b, None)]
    for row, order, seed, host, secs in spec:
        d = put(root, row, order, seed, 60.0, 70.0, fast=(55.0, 65.0) if row == "slow_surprise" else None)
        res = json.loads((d / "results.json").read_text())
        res["host"], res["base_dtype"] = host, "float32"
        if secs is not None:
            res["timing"] = {"train": secs / 2, "score": 0.0, "eval": secs / 2, "total": secs}
        (d / "results.json").write_text(json.dumps(res))
    rep = paper_report([root])
    table = next(t for t in rep.tables if t.name == "timing")
    rows = list(csv.DictReader(io.StringIO(table.csv)))
    by = {(r["benchmark"], r["host"].split()[0]): r for r in rows}
    sa, sb = by[("Standard CL", "Xeon")], by[("Standard CL", "EPYC")]
    assert (sa["runs"], sa["timed"], float(sa["median_s"]), float(sa["total_s"]), float(sa["thread_s"])) == ("2", "2", 800.0, 1600.0, 3200.0)
    assert (sb["runs"], float(sb["min_s"]), float(sb["max_s"]), float(sb["thread_s"])) == ("2", 1800.0, 3600.0, 5400.0)
    lnt = by[("LNT", "EPYC")]
    assert (lnt["runs"], lnt["timed"], float(lnt["total_s"])) == ("2", "1", 7200.0)  # the untimed run is counted, not timed
    total = by[("all", "all")]
    assert (total["runs"], total["timed"], float(total["total_s"])) == ("6", "5", 14200.0)
    md = rep.markdown()
    assert "## Wall time" in md and "3.94" in table_rows(md, "Wall time")["all"][5]  # 14200 s = 3.94 h


# --------------------------------------------------------------------------- units, Holm, hosts, one std


def claims_csv(rep) -> dict[tuple[str, str], dict]:
    table = next(t for t in rep.tables if t.name == "claims")
    return {(r["claim"], r["benchmark"]): r for r in csv.DictReader(io.StringIO(table.csv))}


@pytest.mark.parametrize("draw", [None, "shared"])
def test_shared_samples_make_the_seed_the_unit(tmp_path, draw):
    """With shared samples (data.draw=shared, or results.json from before the key) the orders of a
    seed train and test on the same examples: a seed's differences are averaged into one unit."""
    rep = paper_report([make_runs(tmp_path / "r", draw)])
    by = claims_csv(rep)
    scl = by[("slow_surprise > slow_surprise (fast)", "Standard CL")]
    # seed 0: orders 1, 2 differ by 5 and 4 -> 4.5; seed 1: 7 and 6 -> 6.5; n = 2 seeds, not 4 pairs
    assert (scl["unit"], scl["n"], scl["n_all"], float(scl["mean_diff"])) == ("seed", "2", "2", 5.5)
    assert float(scl["sd"]) == pytest.approx(math.sqrt(2))
    assert float(scl["ci_lo"]) == pytest.approx(5.5 - t_ppf(0.975, 1) * math.sqrt(2) / math.sqrt(2))
    assert scl["verdict"] == "not shown"  # 4 pairs said "shown"; 2 independent seeds do not
    # "all": seed 0 averages orders 1, 2, 4 (5, 4, 5), seed 1 (7, 6, 7)
    both = by[("slow_surprise > slow_surprise (fast)", "all")]
    assert both["n"] == "2" and float(both["mean_diff"]) == pytest.approx((14 / 3 + 20 / 3) / 2)
    assert all(r["unit"] == "seed" and int(r["n"]) <= 2 for r in by.values())
    md = rep.markdown().split("## Claims")[1]
    assert "unit: seed (samples shared across orders, data.draw=shared)" in md
    assert table_rows(rep.markdown(), "Claims (FP, paired)")["slow_surprise > slow_surprise (fast)"][1] == "2"


def test_order_draws_make_each_pair_a_unit(runs_order):
    rep = paper_report([runs_order])
    by = claims_csv(rep)
    assert {(k[1], r["unit"], r["n"]) for k, r in by.items() if k[0] == "slow_surprise > seq_lora"} == {
        ("Standard CL", "order_seed", "4"), ("LNT", "order_seed", "2"), ("all", "order_seed", "6")}
    assert "unit: (order, seed) (independent data draws, data.draw=order" in rep.markdown()


def test_mixed_draws_use_the_seed_as_unit(tmp_path):
    root = make_runs(tmp_path / "r", draw="order")
    for seed in (0, 1):  # seq_lora's order-1 runs drew shared samples
        put(root, "seq_lora", "1", seed, SEQ[("1", seed)], 80.0, draw="shared")
    by = claims_csv(paper_report([root]))
    mixed = by[("slow_surprise > seq_lora", "Standard CL")]
    assert (mixed["unit"], mixed["n"]) == ("seed", "2")
    assert by[("slow_surprise > seq_lora", "LNT")]["unit"] == "order_seed"  # order 4: every run drew per order
    assert by[("slow_surprise > slow_surprise (fast)", "Standard CL")]["n"] == "4"


def test_holm_adjusts_over_the_claims_of_one_benchmark_group(tmp_path):
    """Two claims each with raw p 0.035: alone each is shown; together Holm makes both 0.070, so
    neither is, though each unadjusted interval lies above 0."""
    root = tmp_path / "r"
    for seed, gain in enumerate((2.0, 3.0, 4.0)):
        put(root, "seq_lora", "1", seed, 50.0, 80.0, draw="order")
        put(root, "ewc", "1", seed, 50.0 + gain, 80.0, draw="order")
        put(root, "reservoir", "1", seed, 50.0 + gain, 80.0, draw="order")
    raw = 2 * (1 - t_cdf(3 / (1 / math.sqrt(3)), 2))  # diffs 2, 3, 4: t = 3 / (1 / sqrt 3) on 2 df
    alone = claims_csv(paper_report([root], claims="none", custom_claims=["ewc>seq_lora"]))
    one = alone[("ewc > seq_lora", "Standard CL")]
    assert (float(one["t_p"]), float(one["holm_p"]), one["holm_family"], one["verdict"]) == (
        pytest.approx(raw, abs=1e-6), pytest.approx(raw, abs=1e-6), "1", "shown")
    rep = paper_report([root], claims="none", custom_claims=["ewc>seq_lora", "reservoir>seq_lora"])
    by = claims_csv(rep)
    for claim in ("ewc > seq_lora", "reservoir > seq_lora"):
        row = by[(claim, "Standard CL")]
        assert float(row["t_p"]) == pytest.approx(raw, abs=1e-6) and raw < 0.05
        assert float(row["holm_p"]) == pytest.approx(2 * raw, abs=1e-6) and row["holm_family"] == "2"
        assert float(row["ci_lo"]) > 0  # the unadjusted interval excludes 0 ...
        assert row["verdict"] == "not shown"  # ... the adjusted p decides
        assert (row["sign_wins"], row["sign_losses"], float(row["sign_p"])) == ("3", "0", 0.25)
    cells = table_rows(rep.markdown(), "Claims (FP, paired)")["ewc > seq_lora"]
    assert cells[4:8] == [f"{raw:.3f}", f"{2 * raw:.3f}", "3/0, p 0.250", "not shown (Holm p 0.0702 >= 0.05)"]
    # a contradicted claim: the mean favours B at Holm p < 0.05
    rev = claims_csv(paper_report([root], claims="none", custom_claims=["seq_lora>ewc"]))
    assert rev[("seq_lora > ewc", "Standard CL")]["verdict"] == "contradicted"


def test_holm_family_is_the_whole_claims_table(runs_order):
    """One family per table: the claims of every benchmark group and the "all" rows together."""
    from surecl.stats import holm

    by = claims_csv(paper_report([runs_order]))
    rows = list(by.values())
    assert {g for _, g in by} == {"Standard CL", "LNT", "all"} and len(rows) == 6
    tested = [r for r in rows if r["t_p"] != ""]  # one row has no spread: not tested, not in the family
    assert len(tested) == 5
    # (the CSV rounds p-values to 6 decimals, and the adjustment multiplies them by up to 5)
    assert [float(r["holm_p"]) for r in tested] == pytest.approx(holm([float(r["t_p"]) for r in tested]), abs=1e-5)
    assert {r["holm_family"] for r in tested} == {"5"}


HOST_A = {"cpu": "Xeon", "cpu_flags": ["avx2", "avx512_bf16"], "threads": 1, "torch": "2.13.0"}
HOST_B = {"cpu": "EPYC", "cpu_flags": ["avx2"], "threads": 1, "torch": "2.13.0"}


def set_hosts(path, *hosts):
    """Record the machines a fixture run ran on (several: a run resumed on another machine)."""
    f = path / "results.json"
    res = json.loads(f.read_text())
    res["host"], res["hosts"], res["base_dtype"] = hosts[-1], list(hosts), "float32"
    f.write_text(json.dumps(res))


def test_a_pair_across_two_recorded_hosts_is_flagged(tmp_path):
    root = tmp_path / "r"
    for seed in range(2):
        set_hosts(put(root, "seq_lora", "1", seed, 50.0, 80.0, draw="order"), HOST_A)
        set_hosts(put(root, "ewc", "1", seed, 53.0 + seed, 80.0, draw="order"), HOST_B if seed == 1 else HOST_A)
    rep = paper_report([root], claims="none", custom_claims=["ewc>seq_lora"])
    row = claims_csv(rep)[("ewc > seq_lora", "Standard CL")]
    assert (row["same_host"], row["other_host"], row["host_unrecorded"], row["host_basis"], row["n"]) == ("1", "1", "0", "all", "2")
    assert table_rows(rep.markdown(), "Claims (FP, paired)")["ewc > seq_lora"][-1] == "cross-host units: 1"


def test_a_run_that_moved_between_hosts_makes_its_pair_cross_host(tmp_path):
    """Two runs resumed the same way (A then B) share a host key, yet parts of each ran on another
    machine: the pair is mixed, not one trajectory."""
    root = tmp_path / "r"
    set_hosts(put(root, "seq_lora", "1", 0, 50.0, 80.0, draw="order"), HOST_A, HOST_B)
    set_hosts(put(root, "ewc", "1", 0, 53.0, 80.0, draw="order"), HOST_A, HOST_B)
    row = claims_csv(paper_report([root], claims="none", custom_claims=["ewc>seq_lora"]))[("ewc > seq_lora", "Standard CL")]
    assert (row["same_host"], row["other_host"]) == ("0", "1")


def test_enough_same_host_units_compute_the_claim_on_them_only(tmp_path):
    root = tmp_path / "r"
    gains = {0: 3.0, 1: 4.0, 2: 5.0, 3: -20.0}  # seed 3 ran its two rows on different machines
    for seed, gain in gains.items():
        set_hosts(put(root, "seq_lora", "1", seed, 50.0, 80.0, draw="order"), HOST_A)
        set_hosts(put(root, "ewc", "1", seed, 50.0 + gain, 80.0, draw="order"), HOST_B if seed == 3 else HOST_A)
    rep = paper_report([root], claims="none", custom_claims=["ewc>seq_lora"])
    row = claims_csv(rep)[("ewc > seq_lora", "Standard CL")]
    assert (row["host_basis"], row["n"], row["n_all"], float(row["mean_diff"])) == ("same_host_only", "3", "4", 4.0)
    assert (row["same_host"], row["other_host"]) == ("3", "1")
    assert table_rows(rep.markdown(), "Claims (FP, paired)")["ewc > seq_lora"][-1] == "same-host units only: 3 of 4"


def test_both_layouts_print_the_same_std(runs, capsys):
    """The orders layout and the paper layout's main table: one convention, the sample std."""
    from surecl.report import aggregate, find_runs, table_csv, table_markdown

    put(runs, "seq_lora", "1", 2, 47.0, 80.0)  # a third seed on one order: 40, 44, 47
    orders, rows = aggregate(find_runs([runs]))
    default_md = table_markdown(orders, rows)
    paper_md = paper_report([runs]).markdown()
    paper = table_rows(paper_md, "Main table")
    assert "sample std over seeds" in default_md and "sample std over seeds" in paper_md.split("## Forgetting")[0]
    for line in default_md.splitlines():
        if line.startswith("| seq_lora") or line.startswith("| slow_surprise"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            shown = [c.removesuffix(" †").split(" (n=")[0] for c in paper[cells[0]][: len(orders)]]
            assert [c.removesuffix(" ‡") for c in cells[1:1 + len(orders)]] == shown, cells[0]
    assert paper["seq_lora"][0].startswith(f"43.7 ± {stdev([40.0, 44.0, 47.0]):.1f}")  # 3.5, not pstdev's 2.9
    assert "| seq_lora | 43.7 ± 3.5 | 51.0 ± 1.4 ‡ | 32.5 ± 3.5 ‡ |" in default_md  # ‡: 2 seeds beside order 1's 3
    default_csv = {r["method"]: r for r in csv.DictReader(io.StringIO(table_csv(orders, rows)))}
    main_csv = {r["row"]: r for r in csv.DictReader(io.StringIO(paper_report([runs]).tables[0].csv))}
    for row in ("seq_lora", "slow_surprise"):
        for o in orders:
            assert float(default_csv[row][f"order_{o}_std"]) == pytest.approx(float(main_csv[row][f"order_{o}_std"]), abs=1e-4)


# --------------------------------------------------------------------------- tasks not learned above their majority class


def _three_task_run(root, row, seed, final, diag, majority, order="4", draw="order"):
    """A 3-task run of ``order`` (LNT) with its final row, its diagonal and majority rates."""
    d = root / rel(row, order, seed)
    d.mkdir(parents=True, exist_ok=True)
    a = [[diag[0], None, None], [None, diag[1], None], list(final)]
    a[2][2] = diag[2]
    fp = sum(a[2]) / 3
    res = {"tasks": ["a", "b", "c"], "metric": "accuracy", "accuracy_matrix": a, "fp": fp, "ap": sum(diag) / 3,
           "forgetting": sum(diag) / 3 - fp, "bwt": 0.0, "avg_incremental": fp, "majority": dict(zip("abc", majority)),
           "config": {"preset": row, "method": "sequential", "seed": seed, "data": {"order": order, "draw": draw},
                      "dual": {"enabled": False}, "replay": {"policy": "surprise" if "surprise" in row else "none"}}}
    (d / "results.json").write_text(json.dumps(res))


def test_a_pair_of_runs_trained_on_different_task_lists_is_confounded(tmp_path):
    """Two rows' runs at one order and seed that trained different streams are no paired
    comparison: the verdict says so, and the Tasks table lists every run's tasks."""
    root = tmp_path / "lnt"
    for seed in range(3):
        _three_task_run(root, "seq_lora", seed, (30 + seed, 40, 50), (80, 80, 80), (25, 50, 50))
        _three_task_run(root, "surprise", seed, (60 + seed, 70, 60), (82, 81, 80), (25, 50, 50))
        f = root / rel("surprise", "4", seed) / "results.json"
        r = json.loads(f.read_text())
        r["tasks"], r["majority"]["d"] = ["a", "b", "d"], 40.0  # its third task is another one
        f.write_text(json.dumps(r))
    rep = paper_report([root], claims="none", custom_claims=["surprise>seq_lora"])
    claim = claims_csv(rep)[("surprise > seq_lora", "LNT")]
    assert claim["verdict"] == "confounded" and "the tasks trained" in claim["confounds"]
    tasks = {r["task"] for r in csv.DictReader(io.StringIO(next(t for t in rep.tables if t.name == "tasks").csv))}
    assert tasks == {"a", "b", "c", "d"}


def test_units_with_no_learned_task_are_not_called_missing_runs(tmp_path):
    """Every run present, but no task learned above its majority class: the claim has no unit,
    and says why, instead of blaming failed or running runs (†)."""
    root = tmp_path / "lnt"
    for seed in range(2):
        _three_task_run(root, "seq_lora", seed, (50, 50, 50), (50, 50, 50), (50, 50, 50))
        _three_task_run(root, "surprise", seed, (50, 50, 50), (50, 50, 50), (50, 50, 50))
    rep = paper_report([root], claims="none", custom_claims=["surprise>seq_lora"])
    claims_md = next(t for t in rep.tables if t.name == "claims").markdown
    row = next(line for line in claims_md.splitlines() if line.startswith("| surprise > seq_lora"))
    assert "(order 4 left out: no learned task)" in row and "planned †" not in row
    assert "a study still running, or runs that failed" not in claims_md


def test_an_order_with_no_learned_task_leaves_missing_runs_of_the_others_visible(tmp_path):
    """Seed units (shared samples): order 4 learns no task, order 5 does; seed 2 never ran. The
    claim stands on order 5's two seeds, says order 4 was left out, and still marks the
    missing seed (†), which counting unscored seeds against the plan had hidden."""
    root = tmp_path / "lnt"
    for seed in (0, 1):
        for order, learned in (("4", False), ("5", True)):
            for row, final in (("seq_lora", (40, 41, 42)), ("surprise", (60 + seed, 62, 61))):
                _three_task_run(root, row, seed, final if learned else (50, 50, 50), (80, 80, 80) if learned else (50, 50, 50),
                                (50, 50, 50), order=order, draw="shared")
    from surecl.report import write_sweep_plan

    write_sweep_plan(root, [{"row": r, "order": o, "seed": s, "path": rel(r, o, s)} for r in ("seq_lora", "surprise")
                            for o in ("4", "5") for s in (0, 1, 2)], {"order_benchmark": {"4": "LNT", "5": "LNT"}})
    rep = paper_report([root], claims="none", custom_claims=["surprise>seq_lora"])
    claims_md = next(t for t in rep.tables if t.name == "claims").markdown
    row = next(line for line in claims_md.splitlines() if line.startswith("| surprise > seq_lora"))
    assert "| 2 of 3 planned † (order 4 left out: no learned task) |" in row, row


def test_the_all_claim_says_it_weighs_orders_not_benchmarks(runs):
    """runs: orders 1 and 2 (Standard CL) and 4 (LNT): the "all" claim and "All avg" weigh
    differently, and the caption says so."""
    rep = paper_report([runs], claims="none", custom_claims=["slow_surprise>seq_lora"])
    assert ("slow_surprise > seq_lora", "all") in claims_csv(rep)
    assert "weigh every order alike" in next(t for t in rep.tables if t.name == "claims").markdown


def test_a_task_no_row_learns_above_its_majority_class_is_left_out_of_the_claims(tmp_path):
    root = tmp_path / "lnt"
    # task c: majority class 50 %, no row gets above 50.5 right after learning it
    for seed, (sq, su) in enumerate([((30, 40, 50), (60, 70, 50)), ((34, 41, 49), (62, 69, 50)), ((31, 44, 50), (66, 72, 49))]):
        _three_task_run(root, "seq_lora", seed, sq, (80, 80, 50), (25, 50, 50))
        _three_task_run(root, "surprise", seed, su, (82, 81, 50.5), (25, 50, 50))
    rep = paper_report([root], claims="none", custom_claims=["surprise>seq_lora"])
    tasks = next(t for t in rep.tables if t.name == "tasks")
    rows = {r["task"]: r for r in csv.DictReader(io.StringIO(tasks.csv))}
    assert rows["c"]["learned"] == "0" and rows["a"]["learned"] == rows["b"]["learned"] == "1"
    assert float(rows["c"]["majority"]) == 50.0 and float(rows["a"]["best"]) == pytest.approx(82.0)
    claim = claims_csv(rep)[("surprise > seq_lora", "LNT")]
    # FP over the learned tasks a, b only: per seed ((60+70) - (30+40))/2 = 30, (62+69-34-41)/2 = 28, (66+72-31-44)/2 = 31.5
    assert float(claim["mean_diff"]) == pytest.approx((30 + 28 + 31.5) / 3)
    claims_md = next(t for t in rep.tables if t.name == "claims").markdown
    assert "left out" in claims_md and "order 4: c" in claims_md
    # the main table's FP is still over every task
    assert rep.study.value(("surprise", "4", 0), "fp") == pytest.approx((60 + 70 + 50.5) / 3)
    # so are the claims of every other metric: AP over a, b is (82 + 81)/2 - (80 + 80)/2 = 1.5 at every seed
    # (with c, 1.5 * 2/3 + 0.5/3); forgetting = AP - FP over the same two tasks
    ap = claims_csv(paper_report([root], metric="ap", claims="none", custom_claims=["surprise>seq_lora"]))[("surprise > seq_lora", "LNT")]
    assert float(ap["mean_diff"]) == pytest.approx(1.5)
    forget = claims_csv(paper_report([root], metric="forgetting", claims="none", custom_claims=["seq_lora>surprise"]))
    # lower is better: seq_lora's forgetting over a, b minus surprise's, per seed (80 - 35) - (81.5 - 65) = 28.5, ...
    per_seed = [(80 - (30 + 40) / 2) - (81.5 - (60 + 70) / 2), (80 - (34 + 41) / 2) - (81.5 - (62 + 69) / 2),
                (80 - (31 + 44) / 2) - (81.5 - (66 + 72) / 2)]
    assert abs(float(forget[("seq_lora > surprise", "LNT")]["mean_diff"])) == pytest.approx(fmean(per_seed))
    assert "AP in the claims is over the tasks some row learns" in next(
        t for t in paper_report([root], metric="ap", claims="none", custom_claims=["surprise>seq_lora"]).tables if t.name == "claims").markdown


def test_a_task_is_learned_against_each_runs_own_majority_rate(tmp_path):
    """With independent draws every run has its own test set and rate: a task is learned when
    the best row's accuracy stands above its own runs' rates, not above one run's."""
    root = tmp_path / "lnt"
    # task c: 24 % at both seeds; its rate is 26 at seed 0 and 22 at seed 1: on average not above it
    _three_task_run(root, "seq_lora", 0, (60, 70, 24), (80, 80, 24), (25, 50, 26))
    _three_task_run(root, "seq_lora", 1, (61, 71, 24), (81, 79, 24), (25, 50, 22))
    for _ in range(2):  # as written, then with the two runs swapped on disk
        rep = paper_report([root], claims="none")
        rows = {r["task"]: r for r in csv.DictReader(io.StringIO(next(t for t in rep.tables if t.name == "tasks").csv))}
        c = rows["c"]
        assert (float(c["majority"]), float(c["majority_min"]), float(c["majority_max"])) == (24.0, 22.0, 26.0)
        assert float(c["margin"]) == pytest.approx(0.0) and c["learned"] == "0"
        assert rows["a"]["learned"] == "1" and float(rows["a"]["margin"]) == pytest.approx(55.5)
        assert rep.study.unlearned("4") == ["c"]
        md = next(t for t in rep.tables if t.name == "tasks").markdown
        assert "24.0 (22.0-26.0)" in md
        # the other seed's run first on disk: the same answer
        shutil.move(str(root / rel("seq_lora", "4", 0)), str(tmp_path / "moved"))
        shutil.move(str(root / rel("seq_lora", "4", 1)), str(root / rel("seq_lora", "4", 0)))
        shutil.move(str(tmp_path / "moved"), str(root / rel("seq_lora", "4", 1)))


def test_a_dual_runs_majority_rate_counts_once(tmp_path):
    """A dual run is two rows (slow and fast) of one run: its test set's rate entered the mean
    twice, so a dual row's seeds outweighed another row's."""
    root = tmp_path / "lnt"
    _three_task_run(root, "seq_lora", 0, (60, 70, 60), (80, 80, 80), (25, 50, 20))
    _three_task_run(root, "slow_surprise", 1, (60, 70, 60), (80, 80, 80), (25, 50, 50))
    f = root / rel("slow_surprise", "4", 1) / "results.json"
    r = json.loads(f.read_text())
    r["config"]["dual"] = {"enabled": True}
    r["fast"] = {k: r[k] for k in ("accuracy_matrix", "fp", "ap", "forgetting", "bwt", "avg_incremental")}
    f.write_text(json.dumps(r))
    rep = paper_report([root], claims="none")
    rows = {r["task"]: r for r in csv.DictReader(io.StringIO(next(t for t in rep.tables if t.name == "tasks").csv))}
    assert float(rows["c"]["majority"]) == pytest.approx(35.0)  # (20 + 50) / 2, not (20 + 50 + 50) / 3


def test_a_seed_unit_needs_every_order_of_its_benchmark(tmp_path):
    """With shared samples a seed is a unit only with every order of its benchmark group, as the
    header says: a row with no run on an order (MTL not yet run on s3) got units averaged over
    the orders it had, t-tested beside complete ones."""
    root = tmp_path / "r"
    for o in ("1", "2", "3"):
        for seed in range(3):
            put(root, "seq_lora", o, seed, 50.0 + seed, 80.0)
            if o != "3":
                put(root, "mtl", o, seed, 60.0 + 2 * seed, 80.0)
    rep = paper_report([root], claims="none", custom_claims=["mtl>seq_lora"])
    claim = claims_csv(rep)[("mtl > seq_lora", "Standard CL")]
    assert (claim["n"], claim["seeds_left_out"], claim["verdict"]) == ("0", "3", "not shown")  # was n 3, "shown"
    assert "0 of 3 planned † (3 seeds lacking an order left out)" in rep.markdown()
    # a row a sweep planned on one order only: its seeds are whole with that order
    plan = [{"row": row, "order": o, "seed": s, "path": rel(row, o, s)} for s in range(3)
            for row, orders in (("seq_lora", "123"), ("mtl", "1")) for o in orders]
    (root / "mtl" / "order2").rename(tmp_path / "unplanned")
    write_sweep_plan(root, plan)
    claim = claims_csv(paper_report([root], claims="none", custom_claims=["mtl>seq_lora"]))[("mtl > seq_lora", "Standard CL")]
    assert (claim["n"], claim["seeds_left_out"], claim["n_planned"]) == ("3", "0", "3")


def test_a_run_records_majority_rates_and_its_report_shows_them(tmp_path, tiny_cache):
    from surecl.data.loading import load_stream
    from surecl.trainer import run

    cfg = build_config("tiny,seq_lora", ["data.tasks=[colors,animals]", "data.n_train=8", "data.n_test=6", "train.epochs=1",
                                          "data.test_sampling=random"])
    res = run(cfg, tmp_path / "r", progress=False, cache_dir=tiny_cache)
    for task in load_stream(cfg, cache_dir=tiny_cache):
        labels = [e.label for e in task.test]
        assert res["majority"][task.name] == pytest.approx(100 * max(labels.count(x) for x in set(labels)) / len(labels))
    assert "majority-class rate per task (%): colors" in (tmp_path / "r" / "report.md").read_text()


def test_general_probe_is_aggregated_per_row(tmp_path, capsys):
    """The paper layout's "General ability" table: per row and probe part the mean before and
    after the stream and the change as mean ± sample std with n; a dual run's fast row takes
    the fast adapter's probe; rows never probed are left out."""
    from statistics import stdev

    probe = {"seq_lora": {0: (40.0, 42.0, 30.0, 28.0), 1: (40.0, 45.0, 30.0, 26.0)},
             "slow_surprise": {0: (40.0, 41.0, 30.0, 29.5), 1: (40.0, 41.5, 30.0, 29.0)}}
    for row, seeds in probe.items():
        for seed, (t0, t1, i0, i1) in seeds.items():
            r = results(row, "1", seed, 50.0 + seed, 60.0, fast=(48.0, 58.0) if row == "slow_surprise" else None, draw="order")
            r["general"] = {"source": "default", "parts": ["text", "instruct"], "metrics": {"text": "perplexity", "instruct": "rouge_l"},
                            "before": {"text": t0, "instruct": i0}, "after": [{"text": t1, "instruct": i1}],
                            "final": {"text": t1, "instruct": i1}, "change": {"text": t1 - t0, "instruct": i1 - i0}}
            if row == "slow_surprise":
                r["general"]["fast"] = {"after": [{"text": t1 + 3, "instruct": i1 - 2}], "final": {"text": t1 + 3, "instruct": i1 - 2},
                                        "change": {"text": t1 + 3 - t0, "instruct": i1 - 2 - i0}}
            d = tmp_path / "runs" / rel(row, "1", seed)
            d.mkdir(parents=True)
            (d / "results.json").write_text(json.dumps(r))
    put(tmp_path / "runs", "reservoir", "1", 0, 45.0, 55.0, draw="order")  # not probed
    assert main(["report", str(tmp_path / "runs"), "--layout", "paper", "--out-dir", str(tmp_path / "rep")]) == 0
    capsys.readouterr()
    md = (tmp_path / "rep" / "report.md").read_text()
    section = md[md.index("## General ability"):]
    section = section[:section.index("\n## ", 3)]
    assert "text in perplexity, instruct in ROUGE-L (F, x100)" in section and "`default`" in section
    lines = {line.split(" | ")[0].strip("| "): line for line in section.splitlines() if line.startswith("| ")}
    assert "reservoir" not in lines
    seq = lines["seq_lora"]
    assert "| 40.00 | 43.50 | +3.50 ± " + f"{stdev([2.0, 5.0]):.2f} (n=2) |" in seq
    assert f"| 30.00 | 27.00 | -3.00 ± {stdev([-2.0, -4.0]):.2f} (n=2) |" in seq
    assert "| 40.00 | 44.25 | +4.25 ± " in lines["slow_surprise (fast)"]  # the fast adapter's own probe
    assert "| 40.00 | 41.25 | +1.25 ± " in lines["slow_surprise"]
    csv_text = (tmp_path / "rep" / "general.csv").read_text().splitlines()
    assert csv_text[0] == "row,text_before,text_after,text_change_mean,text_change_std,text_n,instruct_before,instruct_after,instruct_change_mean,instruct_change_std,instruct_n"


def test_mixed_metric_streams_in_other_orders_are_one_metric():
    """A mixed stream's orders score each task in its own metric: the same metric whatever the
    task order; another task-to-metric assignment is another metric."""
    from surecl.report import one_metric, run_metric

    def mixed(metrics: dict) -> dict:
        return {"metric": "mixed", "metrics": metrics}

    order1 = mixed({"qa": "rouge_l", "colors": "accuracy"})
    order2 = mixed({"colors": "accuracy", "qa": "rouge_l"})
    assert run_metric(order1) == run_metric(order2) == "mixed (colors accuracy, qa rouge_l)"
    assert one_metric([(None, order1), (None, order2)]) == run_metric(order1)
    with pytest.raises(SureclError, match="different metrics"):
        one_metric([(None, order1), (None, mixed({"qa": "exact_match", "colors": "accuracy"}))])


def test_a_joint_run_counts_for_every_task_it_learns(tmp_path):
    """MTL's matrix has one row (after the joint stage): its entry for task j is what it learned
    of j, so a task only MTL learns above its majority class is learned."""
    root = tmp_path / "lnt"
    for seed in range(2):
        _three_task_run(root, "seq_lora", seed, (30, 50, 50), (80, 50, 50), (25, 50, 50))
        d = root / rel("mtl", "4", seed)
        d.mkdir(parents=True)
        res = {"tasks": ["a", "b", "c"], "metric": "accuracy", "accuracy_matrix": [[80.0, 85.0, 50.0]], "fp": 71.7, "ap": 71.7,
               "forgetting": 0.0, "bwt": 0.0, "avg_incremental": 71.7, "majority": {"a": 25, "b": 50, "c": 50},
               "config": {"preset": "mtl", "method": "mtl", "seed": seed, "data": {"order": "4", "draw": "order"}}}
        (d / "results.json").write_text(json.dumps(res))
    st = Study.load([root])
    rates = {t.task: (t.best, t.row) for t in st.task_rates("4")}
    assert rates["b"] == (85.0, "mtl")
    assert st.unlearned("4") == ["c"]


def test_the_sign_test_counts_units_where_a_is_better_for_lower_is_better_metrics(tmp_path):
    """Forgetting: lower is better, so A forgetting less than B at every unit is 4 wins, 0 losses."""
    root = tmp_path / "r"
    for seed in range(4):
        put(root, "seq_lora", "1", seed, 40.0 - seed, 80.0, draw="order")  # forgets 40 + seed
        put(root, "surprise", "1", seed, 60.0 + seed, 70.0, draw="order")  # forgets 10 - seed
    rep = paper_report([root], metric="forgetting", claims="none", custom_claims=["surprise>seq_lora"])
    row = claims_csv(rep)[("surprise > seq_lora", "Standard CL")]
    assert (row["verdict"], row["sign_wins"], row["sign_losses"]) == ("shown", "4", "0")
    assert float(row["mean_diff"]) < 0  # A - B in forgetting: A forgets less


def test_runs_of_other_configurations_pooled_in_one_cell_are_named(tmp_path, capsys):
    """Two seeds of a row on one model and a third on another are one mean in the table: the
    report's header (paper layout) and a warning (orders layout) name the key and the seeds. A
    difference in a section the row's method does not read is not one."""
    root = tmp_path / "r"
    for seed, model, lam in ((0, "t5-large", 0.4), (1, "t5-large", 1e-4), (2, "tiny", 1e-4)):
        d = put(root, "surprise", "1", seed, 50.0 + seed, 80.0, draw="order")
        res = json.loads((d / "results.json").read_text())
        res["config"]["model"] = {"name": model}
        res["config"]["nlora"] = {"lambda_l1": lam}  # another method's section: read by no surprise run
        (d / "results.json").write_text(json.dumps(res))
    md = paper_report([root], claims="none").markdown()
    assert "**Runs pooled into one cell, or into one row's average over a benchmark's orders, differ in configuration**" in md
    assert '- surprise, order 1: model.name "t5-large" at seeds 0, 1; "tiny" at seed 2' in md
    assert "nlora" not in md
    assert main(["report", str(root)]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: runs pooled into one cell or one row's average differ in configuration") == 1 and "model.name" in err


def test_runs_of_models_passed_from_python_count_as_their_provenance_says(tmp_path, capsys):
    """A model passed from Python leaves model.name at its default: two seeds on two such models
    were one mean without a word. Their provenance names them; the run's report.md names the
    model that ran, not the default."""
    from surecl.report import write_run_report

    root = tmp_path / "r"
    for seed, path in ((0, "/models/a"), (1, "/models/a"), (2, "/models/b")):
        d = put(root, "surprise", "1", seed, 50.0 + seed, 80.0, draw="order")
        res = json.loads((d / "results.json").read_text())
        res["config"]["model"] = {"name": "smollm2-135m"}
        res["provenance"] = {"model": {"source": "python", "name_or_path": path, "class": "LlamaForCausalLM"},
                             "data": {"source": "config", "fingerprints": {}}}
        (d / "results.json").write_text(json.dumps(res))
    md = paper_report([root], claims="none").markdown()
    assert '- surprise, order 1: model.name "/models/a (LlamaForCausalLM, passed from Python)" at seeds 0, 1; "/models/b' in md
    assert main(["report", str(root)]) == 0
    assert "/models/b (LlamaForCausalLM, passed from Python)" in capsys.readouterr().err
    res.update(bwt=0.0, buffer={"size": 0, "capacity": 0, "per_task": {}}, timing={"total": 1.0})
    res["config"].update(data={"benchmark": "tiny", "order": "1"}, replay={"policy": "none"}, dual={"enabled": False})
    write_run_report(tmp_path, res)
    assert "model `/models/b (LlamaForCausalLM, passed from Python)`" in (tmp_path / "report.md").read_text()
    # the paper presets' EMA runs per training example: beta 0.995 is not a per-step rate
    res["config"]["dual"] = {"enabled": True, "beta": 0.995, "unit": "example"}
    write_run_report(tmp_path, res)
    assert "dual on (beta 0.995 per new training example)" in (tmp_path / "report.md").read_text()


def test_orders_layout_refuses_a_duplicated_run_and_a_config_without_order(tmp_path, capsys):
    root = tmp_path / "r"
    for seed in range(2):
        put(root, "seq_lora", "1", seed, 50.0, 80.0)
    shutil.copytree(root / "seq_lora" / "order1" / "seed0", root / "copy" / "seed0")
    assert main(["report", str(root)]) == 2
    err = capsys.readouterr().err
    assert "two runs of row 'seq_lora', order 1, seed 0" in err and err.count("\n") == 1
    bad = tmp_path / "bad"
    d = put(bad, "seq_lora", "1", 0, 50.0, 80.0)
    res = json.loads((d / "results.json").read_text())
    res["config"] = {"method": "x", "seed": 0}
    (d / "results.json").write_text(json.dumps(res))
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "no config with preset/method, data.order and seed" in err and "Traceback" not in err and err.count("\n") == 1


def _set_config(d, **keys):
    """Set dotted config keys in the results.json of run folder ``d``."""
    res = json.loads((d / "results.json").read_text())
    for dotted, value in keys.items():
        node = res["config"]
        *path, last = dotted.split("__")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    (d / "results.json").write_text(json.dumps(res))


def test_a_claim_whose_pairs_differ_in_more_than_their_rows_is_confounded(tmp_path):
    """surprise ran on 1,000 examples a task and seq_lora on 200: "surprise > seq_lora" would be
    "shown" from the data size, not the method. A key the row names (its grid key) or its method
    preset sets is the comparison itself."""
    root = tmp_path / "r"
    for seed in range(4):
        for row, fp, n in (("seq_lora", 40.0 + seed, 200), ("surprise", 60.0 + 1.5 * seed, 1000),
                           ("surprise replay.buffer_size=0.2", 62.0 + 2 * seed, 1000)):
            _set_config(put(root, row, "1", seed, fp, 80.0, draw="order"), data__n_train=n)
        _set_config(root / rel("surprise replay.buffer_size=0.2", "1", seed), replay__buffer_size=0.2)
    by = claims_csv(paper_report([root], claims="none", custom_claims=["surprise>seq_lora", "surprise replay.buffer_size=0.2>surprise"]))
    bad = by[("surprise > seq_lora", "Standard CL")]
    assert (bad["verdict"], bad["confounds"]) == ("confounded", "data.n_train") and "data.n_train" in bad["why"]
    assert bad["t_p"] != ""  # the numbers stay, the verdict does not
    grid = by[("surprise replay.buffer_size=0.2 > surprise", "Standard CL")]
    assert (grid["verdict"], grid["confounds"]) == ("shown", "")
    md = paper_report([root], claims="none", custom_claims=["surprise>seq_lora"]).markdown()
    assert "confounded (a pair's runs also differ in data.n_train)" in md and "**confounded**: the two runs of some pair" in md


def test_a_rows_orders_that_differ_in_configuration_are_named(tmp_path):
    """One run per (row, order), so no cell pools two runs: the row's average over the orders of
    a benchmark still pools a model.name that differs between its orders."""
    root = tmp_path / "r"
    for order, model in (("1", "tiny"), ("2", "tiny"), ("3", "other/model")):
        _set_config(put(root, "surprise", order, 0, 50.0, 80.0, draw="order"), model__name=model)
    md = paper_report([root], claims="none").markdown()
    assert '- surprise, Standard CL orders: model.name "tiny" at orders 1, 2; "other/model" at order 3' in md


def test_claims_say_when_planned_units_are_missing_and_leave_out_seeds_lacking_an_order(tmp_path):
    root = tmp_path / "r"
    for order, seed in (("1", 0), ("2", 0), ("1", 1), ("2", 1), ("1", 2)):  # seed 2 lacks order 2
        put(root, "seq_lora", order, seed, 40.0 + seed + int(order), 80.0, draw="order")
        put(root, "surprise", order, seed, 50.0 + 2 * seed, 80.0, draw="order")
    row = claims_csv(paper_report([root], claims="none", custom_claims=["surprise>seq_lora"]))[("surprise > seq_lora", "Standard CL")]
    assert (row["n"], row["n_planned"], row["seeds_left_out"]) == ("5", "6", "0")
    md = paper_report([root], claims="none", custom_claims=["surprise>seq_lora"]).markdown()
    assert "5 of 6 planned †" in md and "† fewer units than the sweep planned" in md
    # shared samples: a seed is a unit only with both orders; seed 2 would weigh order 1 alone
    shared = tmp_path / "s"
    for order, seed in (("1", 0), ("2", 0), ("1", 1), ("2", 1), ("1", 2)):
        put(shared, "seq_lora", order, seed, 40.0 + seed + int(order), 80.0, draw="shared")
        put(shared, "surprise", order, seed, 50.0 + 2 * seed, 80.0, draw="shared")
    row = claims_csv(paper_report([shared], claims="none", custom_claims=["surprise>seq_lora"]))[("surprise > seq_lora", "Standard CL")]
    assert (row["unit"], row["n"], row["seeds_left_out"]) == ("seed", "2", "1")
    assert float(row["mean_diff"]) == pytest.approx(fmean([fmean([50 - 41, 50 - 42]), fmean([52 - 42, 52 - 43])]))


def test_order_benchmarks_of_successive_sweeps_are_kept_and_a_plan_names_its_own(tmp_path):
    """Two sweeps into one folder: the first's orders keep their benchmark; and a plan's mapping
    of an order wins over the built-in one (order 1 is Standard CL unless the plan says else)."""
    write_sweep_plan(tmp_path, [], {"order_benchmark": {"s1": "Standard CL"}})
    write_sweep_plan(tmp_path, [], {"order_benchmark": {"l1": "LNT"}})
    assert json.loads((tmp_path / PLAN_FILE).read_text())["order_benchmark"] == {"s1": "Standard CL", "l1": "LNT"}
    write_sweep_plan(tmp_path, [], {"order_benchmark": {"1": "Mine"}})
    put(tmp_path, "seq_lora", "1", 0, 40.0, 80.0)
    assert Study.load([tmp_path]).bench_of["1"] == "Mine"
    assert Study.load([tmp_path], {"1": "Theirs"}).bench_of["1"] == "Theirs"  # the caller's word is last


@pytest.mark.parametrize("edit, words", [
    (lambda r: r.update(fp=float("nan")), "fp is nan, not a finite number"),
    (lambda r: r.update(fp="61.5"), "fp is '61.5', not a finite number"),
    (lambda r: r["fast"].update(bwt=float("inf")), "fast.bwt is inf"),
    (lambda r: r["accuracy_matrix"][1].pop(), "accuracy_matrix is not rows of finite numbers"),
    (lambda r: r["config"].pop("seed"), "no config with preset/method, data.order and seed"),
])
@pytest.mark.parametrize("layout", ["orders", "paper"])
def test_a_results_file_a_report_cannot_use_is_one_line(tmp_path, capsys, edit, words, layout):
    """An edited or outside results.json (NaN, a string, a ragged matrix, no seed) is one line, not a traceback."""
    d = put(tmp_path / "r", "slow_surprise", "1", 0, 60.0, 80.0, fast=(55.0, 80.0))
    res = json.loads((d / "results.json").read_text())
    edit(res)
    (d / "results.json").write_text(json.dumps(res))
    assert main(["report", str(tmp_path / "r"), "--layout", layout, *(["--out-dir", str(tmp_path / "o")] if layout == "paper" else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "Traceback" not in err[0], err


def test_run_draws_are_independent_units_and_say_so(tmp_path):
    """data.draw=run: every (order, seed) pair is a unit, as with order, and the caption says the
    runs share nothing; a claim pairing run and order draws is over (order, seed) units with the
    order caveat."""
    rep = paper_report([make_runs(tmp_path / "run", draw="run")])
    by = claims_csv(rep)
    assert (by[("slow_surprise > slow_surprise (fast)", "Standard CL")]["unit"], by[("slow_surprise > slow_surprise (fast)", "all")]["n"]) == ("order_seed", "6")
    assert "unit: (order, seed) (independent runs, data.draw=run" in rep.markdown()
    head = rep.markdown().split("## ")[0]  # the header names the std convention and the draws
    assert "Every ± is a sample standard deviation (n − 1 denominator) over runs" in head
    assert "Data draws: data.draw=run (every (order, seed) run independent" in head and "data.draw=order" not in head
    mixed = make_runs(tmp_path / "mixed", draw="run")
    put(mixed, "seq_lora", "1", 0, SEQ[("1", 0)], 80.0, draw="order")  # one run made under order draws
    rep = paper_report([mixed])
    assert claims_csv(rep)[("slow_surprise > seq_lora", "all")]["unit"] == "order_seed"
    assert "independent data draws, data.draw=order" in rep.markdown()
    head = rep.markdown().split("## ")[0]
    assert "data.draw=order (every (order, seed) run draws its own data; the runs of one seed share" in head and "data.draw=run" in head


def test_unit_seed_averages_each_seeds_pairs_over_its_orders(runs_order, tmp_path, capsys):
    """--unit seed: the claims' unit is the seed even where every run drew its own data (a unit
    that stays valid where the runs of a seed share its random streams, data.draw=order)."""
    auto = claims_csv(paper_report([runs_order]))[("slow_surprise > slow_surprise (fast)", "Standard CL")]
    rep = paper_report([runs_order], unit="seed")
    seed = claims_csv(rep)[("slow_surprise > slow_surprise (fast)", "Standard CL")]
    assert (auto["unit"], auto["n"]) == ("order_seed", "4")
    # per seed over orders 1 and 2: seed 0 (5 + 4) / 2, seed 1 (7 + 6) / 2 (SLOW - FASTV, as test_default_claims)
    assert (seed["unit"], seed["n"], float(seed["mean_diff"])) == ("seed", "2", pytest.approx(5.5))
    assert "unit: seed (--unit seed: each seed's pairs averaged over its orders" in rep.markdown()
    # the caption says what this unit does, not the default rule (independent draws: each pair a unit)
    caption = rep.markdown().split("## Claims")[1]
    assert "averaged over its orders (those of the row's benchmark group) into one unit, whatever the runs' draws" in caption
    assert "with independent draws each (order, seed) pair is a unit" not in caption
    assert main(["report", str(runs_order), "--layout", "paper", "--unit", "seed", "--out-dir", str(tmp_path / "rep")]) == 0
    assert "--unit seed" in (tmp_path / "rep" / "claims.md").read_text()
    capsys.readouterr()
    with pytest.raises(SureclError, match="--unit"):
        paper_report([runs_order], unit="order")


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("tasks", 3, "tasks is not a list of task names"),
        ("tasks", [{"a": 1}], "tasks is not a list of task names"),
        ("metric", ["a"], "metric is not a name"),
        ("metric", None, "metric is not a name"),
        ("config.dual", None, "config.dual is not a mapping"),
        ("config.replay", [1], "config.replay is not a mapping"),
        ("general", {"metrics": 3}, "general.metrics is not a mapping"),
    ],
)
@pytest.mark.parametrize("layout", ["orders", "paper"])
def test_a_results_file_of_other_types_is_one_line(tmp_path, capsys, field, value, words, layout):
    """Valid JSON with the keys a run writes but types it never writes: one line naming the
    file and the field (each was a traceback in one layout or both)."""
    runs = tmp_path / "runs"
    for seed in (0, 1):
        put(runs, "seq_lora", "1", seed, 60.0 + seed, 50.0)
    d = put(runs, "surprise", "1", 0, 70.0, 65.0)
    res = json.loads((d / "results.json").read_text())
    where, _, key = field.rpartition(".")
    (res[where] if where else res)[key] = value
    (d / "results.json").write_text(json.dumps(res))
    assert main(["report", str(runs), "--layout", layout]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results.json" in err[0] and words in err[0], err


# --------------------------------------------------------------------------- file names and grid rows


def test_orders_of_one_slug_get_their_own_heatmaps(tmp_path):
    """Order names are case-sensitive and may hold '+': s1 and S1, a+b and a_b are four orders,
    so four heatmaps (a stem shared by several orders gets each one's position), while an order
    whose stem is its own keeps today's name."""
    root = tmp_path / "runs"
    orders = {"s1": 40.0, "S1": 50.0, "a+b": 60.0, "a_b": 70.0, "s2": 80.0}
    for order, fp in orders.items():
        for seed in (0, 1):
            put(root, "seq_lora", order, seed, fp + seed, 90.0)
    rep = paper_report([root])
    assert rep.study.orders == ["S1", "s1", "s2", "a+b", "a_b"]
    stems = {cap.split(":", 1)[0]: stem for stem, cap, _ in rep.heatmaps}
    assert stems == {"Order S1": "heatmap_s1_1", "Order s1": "heatmap_s1_2", "Order s2": "heatmap_s2",
                     "Order a+b": "heatmap_a_b_4", "Order a_b": "heatmap_a_b_5"}
    out = tmp_path / "out"
    written = rep.write(out)
    assert len(written) == len({p.name for p in written})
    assert sorted(p.stem for p in out.glob("heatmap_*.png")) == sorted(stems.values())
    report = (out / "report.md").read_text()
    for stem, cap, png in rep.heatmaps:
        assert (out / f"{stem}.png").read_bytes() == png  # no figure replaced by another order's
        assert report.count(f"]({stem}.png)") == 1
        assert f"{cap}\n\n![{stem}]({stem}.png)" in report
    assert len({png for _, _, png in rep.heatmaps}) == 5


def test_ablation_keys_of_one_slug_get_their_own_tables(tmp_path):
    root = tmp_path / "runs"
    for key, fp in (("train.lr", 50.0), ("train.LR", 60.0)):
        for value in ("1", "2"):
            for seed in (0, 1):
                put(root, f"seq_lora {key}={value}", "1", seed, fp + float(value) + seed, 90.0)
    rep = paper_report([root])
    abl = {t.title: t.name for t in rep.tables if t.name.startswith("ablation_")}
    assert abl == {"Ablation: train.LR": "ablation_train.lr_1", "Ablation: train.lr": "ablation_train.lr_2"}
    out = tmp_path / "out"
    rep.write(out)
    for title, name in abl.items():
        assert (out / f"{name}.md").read_text().startswith(f"## {title}\n")
        assert (out / f"{name}.png").is_file() and (out / f"{name}.csv").is_file()
    assert not (out / "ablation_train.lr.md").exists()


def test_write_refuses_two_files_of_one_name(runs, tmp_path):
    """A report whose tables or figures would share a file name is refused before anything is
    written (a later file silently replaced an earlier one)."""
    from surecl.report import Table

    rep = paper_report([runs])
    rep.heatmaps = rep.heatmaps + [(rep.heatmaps[0][0], "another order", rep.heatmaps[1][2])]
    out = tmp_path / "out"
    with pytest.raises(SureclError, match="heatmap_1.png"):
        rep.write(out)
    assert not out.exists()
    rep = paper_report([runs])
    rep.tables = rep.tables + [Table("main", "Main again", "text", "a\n")]
    with pytest.raises(SureclError, match="main"):
        rep.write(out)
    assert not out.exists()
    rep = paper_report([runs])
    rep.tables = rep.tables + [Table("Main", "Main again", "text", "a\n")]  # one file on a case-insensitive disk
    with pytest.raises(SureclError, match="Main"):
        rep.write(out)
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("slow_surprise replay.buffer_size=300 (fast)", ("slow_surprise", (("replay.buffer_size", "300"),), True)),
        ("slow_surprise lora.target_modules=[q_proj, v_proj]",
         ("slow_surprise", (("lora.target_modules", "[q_proj, v_proj]"),), False)),
        ("slow_surprise lora.target_modules=[q_proj, k_proj, v_proj, o_proj] train.lr=1e-4 (fast)",
         ("slow_surprise", (("lora.target_modules", "[q_proj, k_proj, v_proj, o_proj]"), ("train.lr", "1e-4")), True)),
        ("seq_lora model.name=/models/my model", ("seq_lora", (("model.name", "/models/my model"),), False)),
        ("seq_lora model.name=a  b", ("seq_lora", (("model.name", "a  b"),), False)),  # the spaces as they were
        ("seq_lora", ("seq_lora", (), False)),
        ("slow_surprise (fast)", ("slow_surprise", (), True)),
        ("my method k=v", ("my method k=v", (), False)),  # a second word that is no key=value: a plain row
        ("seq_lora k", ("seq_lora k", (), False)),
        # a value's word holding "=" that is no config key continues the value
        ("seq_lora model.name=/models/a x=y", ("seq_lora", (("model.name", "/models/a x=y"),), False)),
        ("seq_lora data.template=a b=c train.lr=1e-4 (fast)", ("seq_lora", (("data.template", "a b=c"), ("train.lr", "1e-4")), True)),
        ("seq_lora log_every=5", ("seq_lora", (("log_every", "5"),), False)),
        ("seq_lora method=ewc", ("seq_lora", (("method", "ewc"),), False)),  # a grid over the method
        ("seq_lora ewc.lam=1000", ("seq_lora", (("ewc.lam", "1000"),), False)),  # an outside method's section too
    ],
)
def test_parse_row(name, parsed):
    from surecl.report import parse_row

    assert parse_row(name) == parsed


@pytest.mark.parametrize(
    ("key", "values"),
    [("lora.target_modules", ["[q_proj, v_proj]", "[q_proj, k_proj, v_proj, o_proj]"]),
     ("model.name", ["models/a", "my models/b"])],
)
def test_grid_values_with_spaces_are_in_their_ablation_table(tmp_path, key, values):
    """A sweep names a grid row ``method key=value``; a value holding a space is still one
    point of its key's ablation table (it was left out of it, or the table was missing)."""
    root = tmp_path / "runs"
    for i, value in enumerate(values):
        for seed in (0, 1):
            put(root, f"slow_surprise {key}={value}", "1", seed, 60.0 + 10 * i + seed, 90.0, fast=(50.0, 85.0))
            put(root, "seq_lora", "1", seed, 40.0 + seed, 80.0)
    rep = paper_report([root])
    abl = next(t for t in rep.tables if t.name == f"ablation_{key}")
    rows = table_rows(f"## {abl.title}\n" + abl.markdown, abl.title)
    assert rows[key] == ["slow_surprise", "slow_surprise (fast)"]
    assert list(rows)[1:] == sorted(values)
    assert rows[values[0]][0] == "60.5 ± 0.7" and rows[values[1]][0] == "70.5 ± 0.7"
    # grid rows are drawn in the ablation, not among the heatmaps' methods
    assert all(f"{key}=" not in cap for _, cap, _ in rep.heatmaps)


def test_stems_stay_unique_beside_a_name_like_a_suffixed_stem():
    from surecl.report import _stems

    assert _stems("heatmap_", ["S1", "s1", "s1_2", "4"]) == {"S1": "heatmap_s1_1", "s1": "heatmap_s1_2_2",
                                                            "s1_2": "heatmap_s1_2", "4": "heatmap_4"}
