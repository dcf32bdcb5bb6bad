"""CLI workflows: sweep (skips finished runs), report (paper table shape), list, JSONL tasks."""

from __future__ import annotations

import csv
import io
import json

import pytest

from surecl.cli import main
from surecl.data.jsonl import load_jsonl_task
from surecl.errors import SureclError
from surecl.report import aggregate, table_markdown

SMALL = ["data.tasks=[colors,animals]", "data.n_train=16", "data.n_test=8", "train.epochs=1"]


def test_sweep_runs_grid_then_skips_finished(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    argv = ["sweep", "--config", "tiny", "--methods", "seq_lora,surprise", "--seeds", "0,1", "--out", str(tmp_path / "sw"), "--quiet", *SMALL]
    assert main(argv) == 0
    first = capsys.readouterr()
    runs = sorted(p.parent.relative_to(tmp_path / "sw").as_posix() for p in (tmp_path / "sw").rglob("results.json"))
    assert runs == [f"{m}/orderdefault/seed{s}" for m in ("seq_lora", "surprise") for s in (0, 1)]
    for run in runs:
        cfg = json.loads((tmp_path / "sw" / run / "results.json").read_text())["config"]
        assert cfg["preset"] == run.split("/")[0] and cfg["model"]["name"] == "tiny"
        assert cfg["replay"]["policy"] == ("none" if run.startswith("seq_lora") else "surprise")
    assert "| seq_lora |" in first.out and "| surprise |" in first.out
    table = list(csv.reader(open(tmp_path / "sw" / "table.csv")))
    assert table[0][:4] == ["method", "order_default_mean", "order_default_std", "order_default_n"]
    assert {row[0]: row[3] for row in table[1:]} == {"seq_lora": "2", "surprise": "2"}
    assert main(argv) == 0
    assert capsys.readouterr().err.count("finished, skipped") == 4


def fake(method, order, seed, fp):
    return {"fp": fp, "config": {"preset": method, "method": "sequential", "data": {"order": order}, "seed": seed}}


def test_report_aggregates_orders_and_seeds():
    runs = [fake("surprise", "1", 0, 70.0), fake("surprise", "1", 1, 74.0), fake("surprise", "2", 0, 80.0), fake("seq_lora", "1", 0, 40.0)]
    orders, rows = aggregate(runs)
    assert orders == ["1", "2"]
    by = {m: (stats, avg) for m, stats, avg in rows}
    assert by["surprise"][0]["1"] == (72.0, pytest.approx(8 ** 0.5), 2)  # mean, sample std (n - 1), seeds
    assert by["surprise"][1][0] == pytest.approx((72.0 + 80.0) / 2)
    md = table_markdown(orders, rows)
    assert "| surprise | 72.0 ± 2.8 | 80.0 ‡ | 76.0 |" in md  # one seed: no ±; fewer seeds than order 1: ‡
    assert "‡ fewer seeds than the row's other orders (a run failed or is missing): surprise order 2: 1 of 2." in md
    both = table_markdown(*aggregate(runs + [fake("surprise", "2", 1, 84.0)]))
    assert "| surprise | 72.0 ± 2.8 | 82.0 ± 2.8 | 77.0 ± 2.8 |" in both and "‡" not in both  # seeds' means 75, 79
    # perplexity: FP is lower-is-better, BWT (sign-flipped to "higher: less forgetting") is not
    assert table_markdown(orders, rows, "fp", "perplexity").startswith("FP (perplexity, lower is better)")
    assert table_markdown(orders, rows, "bwt", "perplexity").startswith("BWT (perplexity, higher is better)")
    # seq_lora has order 1 only: its average is not comparable with surprise's, and says so
    assert "| seq_lora | 40.0 | - | 40.0 † |" in md and "† averaged over the orders the row has" in md and "seq_lora lacks 2" in md
    from surecl.report import table_csv

    table = {r[0]: r for r in csv.reader(io.StringIO(table_csv(orders, rows)))}
    assert table["method"][-1] == "avg_orders" and (table["surprise"][-1], table["seq_lora"][-1]) == ("2", "1")


def test_report_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    (tmp_path / "results.json").write_text("{")
    assert main(["report", str(tmp_path)]) == 2
    assert "not a readable results.json" in capsys.readouterr().err


def test_list_names_presets_and_orders(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("slow_surprise", "surprise_sbua", "label_surprise", "per_task", "mtl", "MNLI", "dbpedia"):
        assert word in out


def test_jsonl_task_with_header(tmp_path):
    path = tmp_path / "fruit.jsonl"
    rows = [{"task": "fruit", "instruction": "Which fruit? ", "labels": ["apple", "pear"]}]
    rows += [{"sentence": f"s{i}", "label": ["apple", "pear"][i % 2], "split": "test" if i > 5 else "train"} for i in range(8)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = load_jsonl_task(path)
    assert (task.name, task.labels, len(task.train), len(task.test)) == ("fruit", ["apple", "pear"], 6, 2)


@pytest.mark.parametrize(
    "lines, words",
    [
        (['{"sentence": "a", "label": "x"}', "{oops"], ["line 2", "malformed JSON"]),
        (['{"sentence": "a", "label": "x", "split": "dev"}'], ["split must be"]),
        (['{"task": "t", "labels": ["x"]}', '{"sentence": "a", "label": "y"}', '{"sentence": "b", "label": "x", "split": "test"}'], ["'y'", "not in its labels"]),
        (['{"sentence": "a", "label": "x"}'], ["empty test split"]),
        (['{"task": "../evil", "labels": ["x"]}', '{"sentence": "a", "label": "x"}', '{"sentence": "a", "label": "x", "split": "test"}'], ["path separators"]),
    ],
)
def test_bad_jsonl(tmp_path, lines, words):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(SureclError) as err:
        load_jsonl_task(path)
    for w in words:
        assert w in str(err.value)


def test_sweep_grid_gives_one_row_per_ablation_value(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    argv = ["sweep", "--config", "tiny", "--methods", "surprise", "--grid", "replay.buffer_size=4,8", "--out", str(tmp_path / "g"), "--quiet", *SMALL]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| surprise replay.buffer_size=4 |" in out and "| surprise replay.buffer_size=8 |" in out
    caps = {json.loads(p.read_text())["config"]["replay"]["buffer_size"]: json.loads(p.read_text())["buffer"]["capacity"] for p in (tmp_path / "g").rglob("results.json")}
    assert caps == {4.0: 4, 8.0: 8}


def test_sweep_goes_on_past_a_failed_run_and_names_it(tmp_path, capsys, monkeypatch):
    """A run that stops with an error (a non-finite loss, say) is named; the next runs still run;
    the sweep ends with exit code 2 and a line listing what to resume."""
    import surecl.trainer as trainer

    monkeypatch.setenv("SURECL_CACHE", str(tmp_path / "cache"))
    real = trainer.run

    def flaky(cfg, out, **kw):
        if cfg.seed == 0 and cfg.replay.policy == "surprise":
            raise SureclError("non-finite loss (nan) at task colors step 1; the last checkpoint is intact")
        return real(cfg, out, **kw)

    monkeypatch.setattr(trainer, "run", flaky)
    argv = ["sweep", "--config", "tiny", "--methods", "surprise,seq_lora", "--seeds", "0,1", "--out", str(tmp_path / "sw"), "--quiet", *SMALL]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "surprise/orderdefault/seed0: error: non-finite loss" in err
    assert "1 run(s) failed and were left to resume" in err
    done = sorted(p.parent.relative_to(tmp_path / "sw").as_posix() for p in (tmp_path / "sw").rglob("results.json"))
    assert done == ["seq_lora/orderdefault/seed0", "seq_lora/orderdefault/seed1", "surprise/orderdefault/seed1"]
