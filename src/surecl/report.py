"""Reports a researcher can paste into a paper: per-run markdown and heatmap, and the
multi-run table (one column per task order, their mean, +- sample std over seeds, one row per
method), and the paper layout: main table with benchmark averages, forgetting table, ablation
tables and plots, paired claims over independent units (Student-t intervals, t and sign tests,
Holm-adjusted verdicts, same-host units where enough exist), and the runs a sweep planned but did
not finish. Every ± in every table and CSV of both layouts is the sample std (n − 1)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, median, stdev

from surecl.card import one_stage
from surecl.checkpoint import write_text
from surecl.config import read_view
from surecl.errors import SureclError
from surecl.metrics import METRIC_NAMES, metric_words, summarise


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


JOINT_ROW = "all tasks (trained jointly)"
"""The name of a one-stage run's (MTL's) only evaluated row, which the matrix keeps as its last."""


def joint_run(a: list[list[float | None]]) -> bool:
    """Whether ``a`` is a one-stage run's matrix (MTL's): every row but the last empty."""
    return len(a) > 1 and all(v is None for row in a[:-1] for v in row)


def row_names(tasks: list[str], a: list[list[float | None]]) -> list[str | None]:
    """What each matrix row is "after": its task, or for a one-stage run :data:`JOINT_ROW` for
    the last row and None (not shown) for the stages it never had."""
    if joint_run(a):
        return [None] * (len(a) - 1) + [JOINT_ROW]
    return list(tasks[: len(a)])


def matrix_markdown(tasks: list[str], a: list[list[float | None]], initial: list[float] | None = None, digits: int = 1) -> str:
    lines = ["| after \\ on | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    if initial:
        lines.append("| (before training) | " + " | ".join(_fmt(v, digits) for v in initial) + " |")
    for name, row in zip(row_names(tasks, a), a):
        if name is not None:
            lines.append(f"| {name} | " + " | ".join(_fmt(v, digits) for v in row) + " |")
    return "\n".join(lines)


def _draw_matrix(ax, tasks: list[str], a: list[list[float | None]], title: str, metric: str = "accuracy", labels: bool = True,
                 scale: tuple[float, float] | None = None):
    """One accuracy (or perplexity) matrix on ``ax``; returns the image for a colour bar.
    ``scale``: the perplexity range (panels sharing one colour bar share it), else the data's."""
    import numpy as np

    joint = joint_run(a)
    if joint:  # one row: what the joint stage gave
        a = a[-1:]
    data = np.array([[np.nan if v is None else v for v in row] for row in a], dtype=float)
    if metric == "perplexity":  # lower is better: reversed colours, range from the data
        lo, hi = scale if scale is not None else (np.nanmin(data), np.nanmax(data))
        im = ax.imshow(data, vmin=lo, vmax=max(hi, lo + 1e-6), cmap="viridis_r")
        dark = lambda v: v > lo + 0.4 * (hi - lo)  # noqa: E731
    else:
        im = ax.imshow(data, vmin=0, vmax=100, cmap="viridis")
        dark = lambda v: v < 60  # noqa: E731
    ax.set_xticks(range(len(tasks)), tasks, rotation=45, ha="right")
    ax.set_yticks(range(len(a)), [JOINT_ROW] if joint else tasks[: len(a)])
    if labels:
        ax.set_xlabel("evaluated on task")
        ax.set_ylabel("after training on task")
    ax.set_title(title, fontsize=9 if not labels else None)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            if not np.isnan(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.0f}" if metric != "perplexity" else f"{data[i, j]:.1f}", ha="center", va="center", color="w" if dark(data[i, j]) else "k", fontsize=8)
    return im


def _png(fig, **savefig) -> bytes:
    """The figure as PNG bytes; closes it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig)
    plt.close(fig)
    return buf.getvalue()


def heatmap(path: Path, tasks: list[str], a: list[list[float | None]], title: str, metric: str = "accuracy",
            per_task: dict[str, str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = max(4.0, 0.55 * len(tasks) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    shown = [f"{t} ({per_task[t]})" for t in tasks] if metric == "mixed" and per_task else tasks
    im = _draw_matrix(ax, shown, a, title, metric)
    fig.colorbar(im, ax=ax, label="score (each task's metric)" if metric == "mixed" else metric_words(metric))
    fig.tight_layout()
    from surecl.checkpoint import _atomic_write_bytes

    _atomic_write_bytes(path, _png(fig, dpi=120))


def _host_lines(results: dict) -> list[str]:
    """Where the run ran (runs from before ``host`` was recorded name only the device)."""
    host = results.get("host")
    if not host:
        return []
    flags = f" ({', '.join(host['cpu_flags'])})" if host.get("cpu_flags") else ""
    gpu = f", GPU {host['gpu']}" if host.get("gpu") else ""
    earlier = [h.get("cpu", "?") for h in (results.get("hosts") or [])[:-1]]
    before = f" (resumed; earlier parts ran on {', '.join(earlier)})" if earlier else ""
    return [f"host: {host['cpu']}{flags}{gpu}, {host['threads']} thread(s), torch {host['torch']}, base {results.get('base_dtype')}{before}", ""]


def _buffer_label_lines(labels: dict[str, dict[str, int]] | None) -> list[str]:
    """The labels of the kept examples, per task (runs from before this field have none)."""
    if not labels:
        return []
    lines = ["buffer labels (kept examples per label):", ""]
    lines += [f"- {task}: " + ", ".join(f"{lab} {n}" for lab, n in counts.items()) for task, counts in labels.items()]
    return [*lines, ""]


def method_of(name) -> type | None:
    """The registered method class named ``name`` (a results.json's ``config.method``), or None
    where none is registered here (an outside method not loaded)."""
    from surecl.registry import method_class

    try:
        return method_class(str(name))
    except SureclError:
        return None


def _fast_section(results: dict, digits: int) -> list[str]:
    """A dual run's fast adapter on the same trajectory: the non-dual method's row, paired,
    where the method's ``fast_is_solo`` holds; else what its ``fast_role`` says (I-LoRA's
    plastic adapter, trained with the slow one's consistency term)."""
    fast = results.get("fast")
    if not fast:
        return []
    from surecl.methods.base import fast_words

    diff = lambda k: None if results.get(k) is None or fast.get(k) is None else results[k] - fast[k]  # noqa: E731
    return [
        f"## Fast adapter ({fast_words(method_of(results['config'].get('method')))})",
        "",
        "| adapter | FP | AP | forgetting | BWT |",
        "|---|---|---|---|---|",
        f"| slow (evaluated above) | {_fmt(results['fp'], digits)} | {_fmt(results['ap'], digits)} | {_fmt(results['forgetting'], digits)} | {_fmt(results['bwt'], digits)} |",
        f"| fast | {_fmt(fast['fp'], digits)} | {_fmt(fast['ap'], digits)} | {_fmt(fast['forgetting'], digits)} | {_fmt(fast['bwt'], digits)} |",
        f"| slow - fast | {_fmt(diff('fp'), digits)} | {_fmt(diff('ap'), digits)} | {_fmt(diff('forgetting'), digits)} | {_fmt(diff('bwt'), digits)} |",
        "",
        matrix_markdown(results["tasks"], fast["accuracy_matrix"], None, digits),
        "",
    ]


def _dual_words(results: dict) -> str:
    dual = results["config"]["dual"]
    if not dual["enabled"]:
        return "off"
    used = results.get("dual_beta")
    unit = " per new training example" if dual.get("unit") == "example" else ""  # beta^n a step of n new examples
    if dual["beta"] == "auto" and used is not None:
        return f"on (beta auto: {used:.4g}{unit}, a window of {dual.get('window_tasks')} tasks)"
    return f"on (beta {dual['beta']}{unit})"


def _majority_lines(results: dict) -> list[str]:
    """Each task's majority-class rate beside its accuracy right after learning it."""
    rates = results.get("majority")
    if not isinstance(rates, dict) or not rates:
        return []
    a = results["accuracy_matrix"]
    cells = []
    for j, task in enumerate(results["tasks"]):
        if rates.get(task) is None:
            continue
        after = a[j][j] if j < len(a) and a[j][j] is not None else (a[-1][j] if a else None)
        cells.append(f"{task} {rates[task]:.1f} (after learning it: {_fmt(after)})")
    return ["majority-class rate per task (%): " + ", ".join(cells), ""] if cells else []


def write_run_report(out_dir: Path, results: dict) -> None:
    cfg = results["config"]
    name = cfg.get("preset") or cfg["method"]
    metric = results.get("metric", "accuracy")
    ppl = metric == "perplexity"
    digits = 2 if ppl else 1
    lines = [
        f"# surecl run: {name}",
        "",
        f"model `{model_words(results)}`, benchmark `{cfg['data']['benchmark']}`, order `{cfg['data']['order']}`, seed {cfg['seed']}",
        f"method `{cfg['method']}`, replay `{cfg['replay']['policy']}`, dual {_dual_words(results)}",
        "",
        f"| FP | AP | forgetting ({'FP-AP' if ppl else 'AP-FP'}) | BWT |",
        "|---|---|---|---|",
        f"| {_fmt(results['fp'], digits)} | {_fmt(results['ap'], digits)} | {_fmt(results['forgetting'], digits)} | {_fmt(results['bwt'], digits)} |",
        "",
        *_fwt_lines(results, digits),
        *_general_lines(results),
        "## Perplexity matrix (lower is better)" if ppl else "## Accuracy matrix (%)" if metric == "accuracy"
        else f"## Score matrix ({metric_words(metric, results.get('metrics'))})",
        "",
        matrix_markdown(results["tasks"], results["accuracy_matrix"], results.get("initial"), digits),
        "",
        *_fast_section(results, digits),
        *_majority_lines(results),
        f"buffer: {results['buffer']['size']} / {results['buffer']['capacity']} {results['buffer']['per_task']}",
        "",
        *_buffer_label_lines(results["buffer"].get("labels")),
        "timing (s): " + ", ".join(f"{k} {v}" for k, v in results["timing"].items()),
        "",
        *_host_lines(results),
        f"![{'perplexity' if ppl else 'accuracy' if metric == 'accuracy' else 'score'} matrix](heatmap.png)",
        "",
    ]
    write_text(out_dir / "report.md", "\n".join(lines))
    heatmap(out_dir / "heatmap.png", results["tasks"], results["accuracy_matrix"], f"{name}: FP {_fmt(results['fp'], digits)}", metric,
            results.get("metrics"))


def _general_lines(results: dict) -> list[str]:
    """The general-ability probe (``eval.general``): one row per part, its value before training,
    after every task and the change, under the evaluation adapter (and the fast one)."""
    general = results.get("general")
    if not general:
        return []

    parts, tasks = general["parts"], results["tasks"]
    shown = [i for i, v in enumerate(general.get("after") or []) if v is not None and i < len(tasks)]
    names = row_names(tasks, results["accuracy_matrix"]) if results.get("accuracy_matrix") else tasks
    stage_words = [names[i] if i < len(names) and names[i] is not None else tasks[i] for i in shown]
    lines = ["## General ability (held-out probe, never trained on)", "",
             f"probe `{general['source']}`: " + ", ".join(
                 f"{p} = {METRIC_NAMES.get(general['metrics'][p], general['metrics'][p])} on {general['rows'][p]} rows" for p in parts)
             + "; a perplexity that rose or a score that fell is what the stream cost the model beyond its tasks", "",
             "| general | before training | " + " | ".join(f"after {name}" for name in stage_words) + " | change |",
             "|---" * (len(shown) + 3) + "|"]

    def value(v: float | None, sign: str = "") -> str:
        """Two decimals; a perplexity a damaged model blew up to millions in three significant digits."""
        return "-" if v is None else f"{v:{sign}.3g}" if abs(v) >= 1e6 else f"{v:{sign}.2f}"

    def line(name: str, summary: dict, part: str) -> str:
        got = summary.get("after") or []
        cells = [value((got[i] or {}).get(part) if i < len(got) else None) for i in shown]
        change = (summary.get("change") or {}).get(part)
        before = (general.get("before") or {}).get(part)
        return f"| {name} | {value(before)} | " + " | ".join(cells) + f" | {value(change, '+')} |"

    for part in parts:
        lines.append(line(part, general, part))
    if general.get("fast"):
        for part in parts:
            lines.append(line(f"{part} (fast adapter)", general["fast"], part))
    return [*lines, ""]


def _fwt_lines(results: dict, digits: int) -> list[str]:
    """Forward transfer, where the run measured it (``eval.before`` and ``eval.ahead``)."""
    if results.get("fwt") is None:
        return []
    if results.get("metric") == "perplexity":  # lower is better: the sign is flipped, so positive = earlier tasks helped
        what = "each next task's perplexity before any training, minus its perplexity right before training it; positive = earlier tasks helped"
    else:
        what = "score on each next task before training it, minus its score before any training"
    return [f"FWT ({what}): {_fmt(results['fwt'], digits)}", ""]


# --------------------------------------------------------------------------- aggregation


def find_runs(paths: list[Path]) -> list[dict]:
    """Every results.json under ``paths`` (files or folders), each read once."""
    return [r for _, r in read_results(paths)]


def run_metric(results: dict) -> str:
    """What a run's matrix is scored in: its ``metric`` (accuracy, rouge_l, exact_match,
    perplexity), a ``mixed`` stream's per-task metrics spelled out by task name (not in the
    stream's order: the orders of one stream are one metric)."""
    metric = results.get("metric", "accuracy")
    if metric == "mixed" and isinstance(results.get("metrics"), dict):
        return "mixed (" + ", ".join(f"{t} {m}" for t, m in sorted(results["metrics"].items())) + ")"
    return metric


POOLED_KEYS_FREE = ("seed", "preset")
"""Config keys the runs of one table cell (row, order) may differ in: the seed is the cell's
replicate, the preset its row name."""
MAX_DIFFERENCES = 8
"""The most pooled-config differences a report spells out (then a count)."""


def _flat_config(cfg: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            out.update(_flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True)
    return out


def config_differences(cells: dict[tuple[str, str], list[tuple[object, dict]]]) -> list[str]:
    """One line per (row, order) cell whose runs (seed, config) differ in a config key other than
    the seed that they read (:func:`surecl.config.read_view`: another method's section, or the EMA
    window under a numeric beta, is not read; a key some run did not record, written before it
    existed, is not compared): such
    runs are pooled into one mean, so a reader must know. E.g. a run of ``--config surprise
    replay.buffer_size=300`` beside default surprise runs, or two models at different seeds."""
    lines = []
    for (row, order), runs in sorted(cells.items()):
        if len(runs) < 2:
            continue
        cfgs = [cfg for _, cfg in runs]
        flats = [(seed, _flat_config(read_view([cfg, *cfgs]))) for seed, cfg in runs]
        keys = set.intersection(*(set(f) for _, f in flats)) - set(POOLED_KEYS_FREE)
        for key in sorted(keys):
            by_value: dict[str, list[str]] = defaultdict(list)
            for seed, f in flats:
                by_value[f[key]].append(str(seed))
            if len(by_value) > 1:
                parts = "; ".join(f"{v} at seed{'s' if len(ss) > 1 else ''} {', '.join(sorted(ss))}" for v, ss in by_value.items())
                lines.append(f"{row}, order {order}: {key} {parts}")
    if len(lines) > MAX_DIFFERENCES:
        lines = lines[:MAX_DIFFERENCES] + [f"... and {len(lines) - MAX_DIFFERENCES} more"]
    return lines


ORDER_KEYS_FREE = ("seed", "preset", "data.order", "data.tasks")
"""Config keys the runs of one row may differ in across the orders of one benchmark group: the
order and its task list are what an order is."""


def order_differences(cells: dict[tuple[str, str], list[tuple[object, dict]]], group_of) -> list[str]:
    """One line per row and benchmark group (``group_of(order)``) whose orders' runs differ in a
    config key other than the order itself (:data:`ORDER_KEYS_FREE`): the row's average over
    the group's orders (the "avg" column, a seed's claim unit) pools them, even with one run
    per cell, which :func:`config_differences` does not look at. A key whose runs differ
    inside one cell is left to that function's line."""
    rows: dict[tuple[str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for (row, order), runs in cells.items():
        rows[(row, group_of(order))][order] = [cfg for _, cfg in runs]
    lines = []
    for (row, group), by_order in sorted(rows.items()):
        if len(by_order) < 2:
            continue
        cfgs = [c for cs in by_order.values() for c in cs]
        flats = {o: [_flat_config(read_view([c, *cfgs])) for c in cs] for o, cs in by_order.items()}
        keys = set.intersection(*(set(f) for fs in flats.values() for f in fs)) - set(ORDER_KEYS_FREE)
        for key in sorted(keys):
            per_order = {o: {f[key] for f in fs} for o, fs in flats.items()}
            if any(len(v) > 1 for v in per_order.values()):  # differs inside a cell: config_differences says so
                continue
            by_value: dict[str, list[str]] = defaultdict(list)
            for o, v in per_order.items():
                by_value[next(iter(v))].append(o)
            if len(by_value) > 1:
                parts = "; ".join(f"{v} at order{'s' if len(os) > 1 else ''} {', '.join(sorted(os, key=order_key))}"
                                  for v, os in by_value.items())
                lines.append(f"{row}, {group} orders: {key} {parts}")
    if len(lines) > MAX_DIFFERENCES:
        lines = lines[:MAX_DIFFERENCES] + [f"... and {len(lines) - MAX_DIFFERENCES} more"]
    return lines


def _aggregate_key(results: dict) -> tuple[str, str, object]:
    """(row, order, seed) of a run as :func:`aggregate` pools it, or one line when its config lacks them."""
    try:
        cfg = results["config"]
        return str(cfg.get("preset") or cfg["method"]), str(cfg["data"]["order"]), _seed(cfg["seed"])
    except (KeyError, TypeError, AttributeError):
        raise SureclError("report: a results.json has no config with preset/method, data.order and seed; move it away or name the run folders to report") from None


def model_words(results: dict) -> str:
    """The base model a run trained: ``model.name``, or for a model passed from Python (whose
    config keeps the default name) what its provenance records."""
    prov = (results.get("provenance") or {}).get("model") or {}
    if prov.get("source") == "python":
        return f"{prov.get('name_or_path') or 'a model'} ({prov.get('class', '?')}, passed from Python)"
    return str(results["config"]["model"]["name"])


def _as_run(results: dict) -> dict:
    """A run's config with what it does not describe for a model or tasks passed from Python
    written in: ``model.name`` as :func:`model_words`, ``data.tasks`` as the tasks it ran."""
    cfg = results["config"]
    prov = results.get("provenance") or {}
    model = (prov.get("model") or {}).get("source") == "python"
    data = (prov.get("data") or {}).get("source") == "python"
    if not (model or data) or not isinstance(cfg.get("model"), dict) or not isinstance(cfg.get("data"), dict):
        return cfg
    out = dict(cfg)
    if model:
        out["model"] = {**cfg["model"], "name": model_words(results)}
    if data:
        out["data"] = {**cfg["data"], "tasks": [str(t) for t in results.get("tasks") or []]}
    return out


def pooled_differences(runs: list[dict]) -> list[str]:
    """:func:`config_differences` of results dicts, by (row, order) as :func:`aggregate` pools
    them; a model or tasks passed from Python count as their provenance says (:func:`_as_run`)."""
    cells: dict[tuple[str, str], list[tuple[object, dict]]] = defaultdict(list)
    for r in runs:
        row, order, seed = _aggregate_key(r)
        cells[(row, order)].append((seed, _as_run(r)))
    from surecl.data.cl_benchmark import BENCHMARK_OF_ORDER

    return config_differences(cells) + order_differences(cells, lambda o: BENCHMARK_OF_ORDER.get(o, "other"))


def one_metric(found: list[tuple[Path | None, dict]]) -> str:
    """The one metric every run is scored in; a one-line error naming each metric with its
    number of runs and one of its files when they differ (an FP in accuracy and one in
    ROUGE-L or perplexity are not the same quantity)."""
    seen: dict[str, list] = {}
    for f, r in found:
        seen.setdefault(run_metric(r), []).append(f)
    if len(seen) > 1:
        parts = [f"{m}: {len(fs)} run{'s' if len(fs) > 1 else ''}" + (f", e.g. {fs[0]}" if fs[0] is not None else "")
                 for m, fs in sorted(seen.items())]
        raise SureclError("report: the runs are scored in different metrics (" + "; ".join(parts)
                          + "); report each metric's runs separately (give their folders)")
    return next(iter(seen), "accuracy")


def aggregate(runs: list[dict], metric: str = "fp") -> tuple[list[str], list[tuple[str, dict[str, tuple[float, float | None, int]], tuple[float, float | None]]]]:
    """Rows of (method, {order: (mean, sample std, n_runs)}, (mean of the order means, its std)).

    Every ± is the sample std (``statistics.stdev``, n − 1), as in the paper layout; None with
    one value. The average's std runs over seeds: each seed's average over the orders, for the
    seeds present in every order of the method (the paper layout's convention); None with fewer
    than two such seeds."""
    table: dict[str, dict[str, list[tuple[object, float]]]] = defaultdict(lambda: defaultdict(list))
    one_metric([(None, r) for r in runs])
    seen: set[tuple[str, str, object]] = set()
    for r in runs:
        row, order, seed = _aggregate_key(r)
        if (row, order, seed) in seen:  # a copied run folder would count twice
            raise SureclError(f"report: two runs of row {row!r}, order {order}, seed {seed}; report them separately")
        seen.add((row, order, seed))
        if r.get(metric) is None:
            continue
        table[row][order].append((seed, r[metric]))
    orders = sorted({o for cells in table.values() for o in cells}, key=lambda o: (not o.isdigit(), o.zfill(3)))
    rows = []
    for method, cells in table.items():
        stats = {}
        for o, pairs in cells.items():
            v = [x for _, x in pairs]
            stats[o] = (fmean(v), stdev(v) if len(v) > 1 else None, len(v))
        means = [stats[o][0] for o in orders if o in stats]
        per_order = [{s: fmean(x for s2, x in cells[o] if s2 == s) for s, _ in cells[o]} for o in orders if o in cells]
        common = set.intersection(*(set(d) for d in per_order))
        per_seed = [fmean(d[s] for d in per_order) for s in common]
        rows.append((method, stats, (fmean(means), stdev(per_seed) if len(per_seed) > 1 else None)))
    return orders, rows


STD_WORDS = "sample std over seeds (n − 1 denominator; no ± with one seed)"


def table_markdown(orders: list[str], rows, metric: str = "fp", unit: str = "accuracy") -> str:
    head = "| method | " + " | ".join(f"Order-{o}" if o.isdigit() else o for o in orders) + " | avg |"
    shown = _unit(metric, unit) if metric in _LABEL else ("perplexity, lower is better" if unit == "perplexity" else _metric_unit(unit))
    d = 2 if unit == "perplexity" else 1
    lines = [f"{metric.upper()} ({shown}), mean ± {STD_WORDS}; avg = mean of the order means, its ± over the seeds "
             "present in every order of the row (each seed's mean over the orders)", "", head, "|---" * (len(orders) + 2) + "|"]
    partial, short = [], []
    for method, stats, (avg, avg_std) in rows:
        most = max((stats[o][2] for o in stats), default=0)
        cells = []
        for o in orders:
            if o not in stats:
                cells.append("-")
                continue
            mean, std, n = stats[o]
            few = n < most  # a failed or missing run: fewer seeds than the row's other orders
            if few:
                short.append(f"{method} order {o}: {n} of {most}")
            cells.append(f"{mean:.{d}f}" + ("" if std is None else f" ± {std:.{d}f}") + (" ‡" if few else ""))
        missing = [o for o in orders if o not in stats]
        if missing:
            partial.append(f"{method} lacks {', '.join(missing)}")
        spread = "" if avg_std is None else f" ± {avg_std:.{d}f}"
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {avg:.{d}f}{spread}{' †' if missing else ''} |")
    if partial:
        lines += ["", "† averaged over the orders the row has, so not comparable with a row that has them all: " + "; ".join(partial) + "."]
    if short:
        lines += ["", "‡ fewer seeds than the row's other orders (a run failed or is missing): " + "; ".join(short) + "."]
    return "\n".join(lines) + "\n"


def table_csv(orders: list[str], rows) -> str:
    """The ``orders`` layout as CSV: per order mean, sample std (empty with one seed) and n; the
    average and its sample std over seeds (see :func:`aggregate`) and how many orders it averages
    (``avg_orders``: fewer than the table's means the row lacks some)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["method"] + [f"order_{o}_{s}" for o in orders for s in ("mean", "std", "n")] + ["avg", "avg_std", "avg_orders"])
    for method, stats, (avg, avg_std) in rows:
        cells = [("" if x is None else x) for o in orders for x in (stats[o] if o in stats else ("", "", 0))]
        w.writerow([method] + cells + [round(avg, 4), "" if avg_std is None else round(avg_std, 4), sum(o in stats for o in orders)])
    return buf.getvalue()


# --------------------------------------------------------------------------- paper layout
#
# ``surecl report --layout paper``: the paper's tables from run directories. A run is one
# (row, order, seed); its row is ``config.preset`` (``"<method>[ key=value ...]"`` for sweep grid
# points), and a dual run with a ``fast`` section in results.json also gives the row
# ``"<row> (fast)"``. The expected runs come from the ``sweep.json`` plans under the given
# directories, or, for runs under no plan, every (row x order x seed) combination seen; a cell
# computed from fewer runs than expected carries a dagger and the runs are named.

FAST = " (fast)"
METRICS = ("fp", "ap", "forgetting", "bwt", "avg_incremental")
PLAN_FILE = "sweep.json"
PLAN_KIND = "surecl-sweep-plan"
DAGGER = "†"
BENCH_ORDER = ("Standard CL", "LNT")
# the paper's row order; unknown rows follow, alphabetically
_ROW_RANK = ["seq_lora", "ewc", "reservoir", "random", "surprise", "surprise_sbua", "surprise_sa", "label_surprise",
             "surprise_aging", "sum_surprise", "online_surprise", "slow_reservoir", "slow_random", "slow_surprise",
             "slow_surprise_sbua", "slow_surprise_sa", "mtl", "per_task"]
_LABEL = {"fp": "FP", "ap": "AP", "forgetting": "forgetting", "bwt": "BWT", "avg_incremental": "avg. incremental"}

Key = tuple  # (row, order, seed)


def higher_is_better(metric: str, kind: str = "accuracy") -> bool:
    """Direction of a summary metric: forgetting is always lower-is-better, BWT always
    higher-is-better; FP/AP/avg. incremental follow the stream (accuracy up, perplexity down)."""
    if metric == "forgetting":
        return False
    if metric == "bwt":
        return True
    return kind != "perplexity"


def _seed(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return str(v)


def _num(v: str):
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)


def order_key(o: str):
    return (not o.isdigit(), o.zfill(6))


_GRID_KEY = re.compile(r"(?:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+|log_every|method)=")
"""The start of a grid word of a row name: a config key (``section.key``, or a top-level one a
sweep takes as a grid key: ``method``, ``log_every``; it refuses ``seed`` and ``preset``) and ``=``."""


def parse_row(name: str) -> tuple[str, tuple[tuple[str, str], ...], bool]:
    """``"slow_surprise replay.buffer_size=300 (fast)"`` -> ("slow_surprise", (("replay.buffer_size", "300"),), True).

    A sweep names a grid row ``" ".join([method, *("key=value", ...)])``, and a value may hold
    spaces (``lora.target_modules=[q_proj, v_proj]``, a model path, ``data.template=a x=y``): a
    word that is not ``<config key>=...`` (a dotted key, :data:`_GRID_KEY`) continues the value
    before it, joined by the whitespace it was split on. A row whose second word is no
    ``key=value`` is a plain row (its whole name, no grid values)."""
    fast = name.endswith(FAST)
    base = name[: -len(FAST)] if fast else name
    parts = re.split(r"(\s+)", base.strip())  # the words, and at odd places the whitespace between them
    words, gaps = parts[0::2], parts[1::2]
    if len(words) < 2 or not _GRID_KEY.match(words[1]):
        return base, (), fast
    grid: list[list[str]] = []
    for gap, word in zip(gaps, words[1:]):
        if _GRID_KEY.match(word):
            grid.append(word.split("=", 1))
        else:
            grid[-1][1] += gap + word
    return words[0], tuple((k, v) for k, v in grid), fast


def row_sort_key(name: str):
    method, grid, fast = parse_row(name)
    rank = _ROW_RANK.index(method) if method in _ROW_RANK else len(_ROW_RANK)
    return (rank, method, tuple((k, _num(v)) for k, v in grid), fast)


@dataclass
class Record:
    row: str
    order: str
    seed: int | str
    values: dict[str, float | None]
    path: Path
    tasks: list[str] = field(default_factory=list)
    matrix: list[list[float | None]] | None = None
    host: str | None = None  # host_key: where the run ran, None for runs that did not record it
    seconds: float | None = None  # results.json timing.total: the run's own train + score + eval time
    threads: int | None = None  # torch threads of the run's last recorded host
    draw: str = "shared"  # config data.draw: "shared" (a seed's samples shared across orders), "order" or "run"
    host_moved: bool = False  # the run recorded several different hosts (resumed on another machine)
    majority: dict[str, float] | None = None  # results.json majority: each task's majority-class rate (%)
    general: dict | None = None  # the probe (results.json general) under this row's weights: source, metrics, before, final, change
    config: dict | None = None  # results.json config: what a claim's two runs must share besides their rows' own keys
    cpu_seconds: float | None = None  # results.json timing.cpu: the run's process CPU seconds (None before it was recorded)
    joint: bool = False  # a one-stage run (MTL): its matrix has the last row alone, and STREAM_ONLY metrics do not apply
    fingerprints: dict[str, str] | None = None  # results.json provenance.data.fingerprints: each task's rows (Task.fingerprint)


STREAM_ONLY = ("ap", "forgetting", "bwt", "avg_incremental", "fwt")
"""Metrics a one-stage (joint) run does not have: results.json holds null for them by design."""

DIAGONAL_ONLY = ("avg_incremental",)
"""Metrics a run under ``eval.matrix=fp_ap`` leaves null by design: it evaluates each task right
after learning it and every task after the last, not the earlier tasks after each stage."""

NOT_APPLICABLE_WHY = {
    "joint": "they trained every task in one stage (MTL): there is no stream to measure along",
    "fp_ap": "eval.matrix=fp_ap evaluates each task right after learning it and every task after the last, not the "
             "earlier tasks after every stage that average incremental accuracy needs",
}
"""Why a run's metric is null by design (:meth:`Study.not_applicable`), as the captions say it."""


def _fingerprints(results: dict) -> dict[str, str] | None:
    """Each task's data fingerprint as results.json ``provenance`` records it (SHA-256 of the
    task's kind, instruction, labels and every sampled train and test row); None before it was."""
    prov = results.get("provenance")
    data = prov.get("data") if isinstance(prov, dict) else None
    fps = data.get("fingerprints") if isinstance(data, dict) else None
    if not isinstance(fps, dict):
        return None
    return {str(t): fp for t, fp in fps.items() if isinstance(fp, str) and fp} or None


# The kernel flags whose presence changes which matmul kernels (and so which rounding) a CPU run uses.
_NUMERIC_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _host_keys(results: dict) -> list[str] | None:
    """The distinct successive machines of a run (see :func:`host_key`); None if unrecorded."""
    hosts = results.get("hosts") or [results.get("host")]
    if not all(isinstance(h, dict) and h.get("cpu") for h in hosts):
        return None
    keys: list[str] = []
    for host in hosts:
        flags = sorted(f for f in host.get("cpu_flags") or [] if f in _NUMERIC_FLAGS)
        gpu, version, threads = host.get("gpu"), host.get("torch"), host.get("threads")
        # a CPU run's thread count: the same bits at 1 and 2 threads on an AVX2 host in fp32 (bench/RESULTS.md
        # §15), not measured on the bf16 hosts, so kept apart; a GPU run's CPU threads compute nothing of the model
        cpu_threads = f"{threads} thread{'s' if threads != 1 else ''}" if threads and not gpu else ""
        key = " ".join(str(x) for x in (host["cpu"], f"[{','.join(flags)}]", f"torch {version}" if version else "",
                                         cpu_threads, f"GPU {gpu}" if gpu else "") if x)
        if not keys or keys[-1] != key:
            keys.append(key)
    return keys


def host_key(results: dict) -> str | None:
    """Where a run ran, as far as its numbers depend on it: the processor, the kernel flags that
    pick torch's CPU kernels (AVX2, AVX-512, their bf16 and AMX forms), torch's version, a CPU
    run's thread count (bit-equal at 1 and 2 threads on an AVX2 host in fp32, bench/RESULTS.md
    §15, but not measured on the bf16 hosts), the GPU and the base model's dtype. Two runs of one config and seed with
    equal keys follow one trajectory; with different keys they are independent runs at the same
    seed. A run resumed on other machines (``hosts``) names them all, in order. None for a run
    that did not record its host."""
    keys = _host_keys(results)
    if keys is None:
        return None
    return " then ".join(keys) + (f" {results['base_dtype']}" if results.get("base_dtype") else "")


def host_moved(results: dict) -> bool:
    """Whether a run recorded several different hosts (parts of it ran on different machines)."""
    keys = _host_keys(results)
    return keys is not None and len(set(keys)) > 1


def data_draw(results: dict) -> str:
    """The run's ``data.draw``: "run" (every (order, seed) run independent, its random streams
    too), "order" (an independent draw of data per (order, seed)) or "shared"
    (a task's sample depends on seed and task only); results.json files from before the key
    existed drew shared samples."""
    data = (results.get("config") or {}).get("data") or {}
    return data.get("draw") if data.get("draw") in ("order", "run") else "shared"


def _run_seconds(results: dict, key: str = "total") -> float | None:
    t = (results.get("timing") or {}).get(key) if isinstance(results.get("timing"), dict) else None
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 else None


def _run_threads(results: dict) -> int | None:
    host = results.get("host")
    n = host.get("threads") if isinstance(host, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _probe_of(results: dict, fast: bool = False) -> dict | None:
    """The general-ability probe of a run (results.json ``general``) under its evaluation
    weights, or with ``fast`` its fast adapter's: source, each part's metric, the values
    before the stream, after its last task and the change; None when not probed."""
    g = results.get("general")
    if not isinstance(g, dict):
        return None
    mine = g.get("fast") if fast else g
    if not isinstance(mine, dict) or not mine.get("final") or not mine.get("change"):
        return None
    return {"source": g.get("source"), "metrics": g.get("metrics") or {}, "before": g.get("before") or {},
            "final": mine["final"], "change": mine["change"]}


@dataclass
class Cell:
    """A table cell: mean (None: no runs), the per-seed values behind its ± and whether any
    expected run is missing from it."""

    mean: float | None
    per_seed: dict = field(default_factory=dict)
    incomplete: bool = False
    pooled: list[float] | None = None  # ablation cells: all values over orders and seeds
    mean_seeds: set | None = None  # average cells: every seed behind the mean (the ± has only those in every cell)

    @property
    def values(self) -> list[float]:
        return self.pooled if self.pooled is not None else list(self.per_seed.values())

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def std(self) -> float | None:
        v = self.values
        return stdev(v) if len(v) > 1 else None


def average_cells(cells: list[Cell]) -> Cell:
    """Mean of the cells' means; its ± runs over the seeds present in every cell (each seed's
    average over the cells). Incomplete when any cell is, or has no runs."""
    present = [c for c in cells if c.mean is not None]
    incomplete = any(c.incomplete for c in cells) or len(present) < len(cells)
    if not present:
        return Cell(None, {}, incomplete)
    common = set.intersection(*(set(c.per_seed) for c in present))
    per_seed = {s: fmean(c.per_seed[s] for c in present) for s in sorted(common, key=str)}
    behind = set().union(*(c.mean_seeds if c.mean_seeds is not None else set(c.per_seed) for c in present))
    return Cell(fmean(c.mean for c in present), per_seed, incomplete, mean_seeds=behind)


@dataclass
class Missing:
    row: str
    order: str
    seed: int | str
    path: str  # "" where no plan names it
    why: str


def read_results(paths: list[Path]) -> list[tuple[Path, dict]]:
    out, seen = [], set()
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise SureclError(f"report: {p} does not exist")
        files = [p] if p.is_file() else sorted(p.rglob("results.json"))
        for f in files:
            if f.resolve() in seen:
                continue
            seen.add(f.resolve())
            try:
                res = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError):
                raise SureclError(f"report: {f} is not a readable results.json") from None
            _check_results(f, res)
            out.append((f, res))
    if not out:
        raise SureclError("report: no results.json found under " + ", ".join(map(str, paths)))
    return out


def _check_results(f: Path, res) -> None:
    """One line for a results.json whose numbers a report cannot use: not an object, a summary
    metric that is not a finite number (NaN, a string; surecl writes neither), or a score matrix
    that is not a list of rows of numbers (or null), one entry per task."""
    def finite(v) -> bool:
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))

    if not isinstance(res, dict):
        raise SureclError(f"report: {f} is not a results object")
    width = len(res.get("tasks") or []) or None
    for where, part in (("", res), ("fast.", res.get("fast") if isinstance(res.get("fast"), dict) else {})):
        for m in METRICS:
            if not finite(part.get(m)):
                raise SureclError(f"report: {f}: {where}{m} is {part.get(m)!r}, not a finite number; move the file away or rerun the run")
        matrix = part.get("accuracy_matrix")
        if matrix is None:
            continue
        if not (isinstance(matrix, list) and all(isinstance(r, list) and all(finite(v) for v in r) and (width is None or len(r) == width)
                                                 for r in matrix)):
            raise SureclError(f"report: {f}: {where}accuracy_matrix is not rows of finite numbers (or null), one entry per task; "
                              "move the file away or rerun the run")


def read_plan(path: Path) -> dict | None:
    """A ``sweep.json`` written by ``surecl sweep``; None for a JSON file of another kind."""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise SureclError(f"report: {path} is not a readable sweep plan") from None
    if not isinstance(plan, dict) or plan.get("kind") != PLAN_KIND:
        return None
    runs = plan.get("runs")
    if not isinstance(runs, list) or not all(isinstance(r, dict) and {"row", "order", "seed", "path"} <= set(r) for r in runs):
        raise SureclError(f"report: {path}: 'runs' must be a list of objects with row, order, seed and path")
    name = (str, int)  # a row, order or seed as surecl writes it (YAML may have made an order a number)
    for r in runs:
        bad = [k for k in ("row", "order", "seed") if not isinstance(r[k], name) or isinstance(r[k], bool)]
        bad += [] if isinstance(r["path"], str) and r["path"] else ["path"]
        if bad:
            raise SureclError(f"report: {path}: a run's {' and '.join(bad)} must be a name (the run {r!r}); "
                              "sweep.json is written by surecl sweep: move it away or rerun the sweep")
    by_plan = plan.get("plan_claims", {})
    claims = [plan.get("claims"), *(by_plan.values() if isinstance(by_plan, dict) else [by_plan])]
    if not all(c is None or (isinstance(c, list) and all(isinstance(t, str) for t in c)) for c in claims):
        raise SureclError(f"report: {path}: 'claims' (and each plan's in 'plan_claims') must be a list of texts like 'A>B'; "
                          "sweep.json is written by surecl sweep: move it away or rerun the sweep")
    benches = plan.get("order_benchmark")
    if benches is not None and not (isinstance(benches, dict) and all(isinstance(b, str) for b in benches.values())):
        raise SureclError(f"report: {path}: 'order_benchmark' must map order names to benchmark names; "
                          "sweep.json is written by surecl sweep: move it away or rerun the sweep")
    return plan


def _claims_by_plan(plan: dict) -> dict[str, list[str]]:
    """A sweep.json's claims per plan (``plan_claims``: the plan's path as given to the sweep, or
    "" for none); a file written before claims were kept per plan has them under its ``plan``."""
    if isinstance(plan.get("plan_claims"), dict):
        return {str(k): list(v) for k, v in plan["plan_claims"].items()}
    return {str(plan.get("plan") or ""): list(plan["claims"])} if plan.get("claims") else {}


PLAN_LOCK = ".surecl-sweep-lock"
"""The file whose ``flock`` :func:`write_sweep_plan` holds while it reads, merges and replaces
``sweep.json``, so two sweeps started at once into one folder keep each other's runs."""


def write_sweep_plan(root: Path, runs: list[dict], meta: dict | None = None) -> Path:
    """Write ``<root>/sweep.json`` atomically: the runs a sweep plans (row, method, grid, order,
    seed, dual, path relative to root), with ``meta`` (the plan's config, overrides, orders'
    benchmarks and claims). Runs already planned there by an earlier sweep into the same folder
    are kept (a later sweep adds orders, seeds or methods), as are its benchmarks and claims; the read, merge and
    write hold :data:`PLAN_LOCK`, so a sweep started beside another loses none of its runs."""
    import os

    from surecl.checkpoint import fcntl, write_json

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / PLAN_FILE
    if path.exists() and read_plan(path) is None:  # refused before the lock file is made: the folder stays as it was
        raise SureclError(f"sweep: {path} exists and is not a surecl sweep plan; move it away")
    try:  # read-only is enough for a flock (a folder shared by several users); never through a symbolic link
        fd = os.open(root / PLAN_LOCK, os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as e:
        why = "it is a symbolic link: remove it" if (root / PLAN_LOCK).is_symlink() else f"{e.strerror or e}"
        raise SureclError(f"sweep: cannot open {root / PLAN_LOCK} ({why}), or choose another --out") from None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits: the holder only reads and replaces one small file
        merged: dict[str, dict] = {}
        meta = dict(meta or {})
        if path.exists():
            old = read_plan(path)
            if old is None:
                raise SureclError(f"sweep: {path} exists and is not a surecl sweep plan; move it away")
            merged = {r["path"]: r for r in old["runs"]}
            # an earlier sweep's orders keep their benchmark (the report groups and averages by it)
            meta["order_benchmark"] = {**(old.get("order_benchmark") or {}), **(meta.get("order_benchmark") or {})}
            by_plan = _claims_by_plan(old)
        else:
            by_plan = {}
        if "claims" in meta:  # each plan's claims as it was last swept: a claim taken out of a plan leaves the reports
            by_plan[str(meta.get("plan") or "")] = list(dict.fromkeys(meta["claims"]))
        if by_plan:
            meta["plan_claims"] = by_plan
            meta["claims"] = list(dict.fromkeys(c for claims in by_plan.values() for c in claims))
        for r in runs:
            merged[r["path"]] = r
        write_json(path, {"kind": PLAN_KIND, "format": 1, **meta, "runs": list(merged.values())})
    finally:
        os.close(fd)  # releases the flock
    return path


LEARNED_MARGIN = 1.0
"""Points above the majority-class rate a task's best accuracy must reach to count as learned."""


@dataclass
class TaskRate:
    """A task of one order against its majority class (:meth:`Study.task_rates`)."""

    task: str
    majority: float  # mean over the runs of the order that recorded it
    majority_lo: float
    majority_hi: float
    best: float | None  # the best row's accuracy right after learning the task, mean over its seeds
    row: str | None
    margin: float | None  # that row's mean of (accuracy - its own run's rate)
    unjudged: tuple[tuple[str, int | str], ...] = ()  # (row, seed) of the order's runs that train the task and have no rate for it

    @property
    def learned(self) -> bool:
        return self.margin is not None and self.margin > LEARNED_MARGIN

    @property
    def judged(self) -> bool:
        """Whether every run of the order that trains the task has its rate: a run without one
        (a results.json from before ``majority``) may have learned it, so none is called unlearned."""
        return not self.unjudged


class Study:
    """Runs of one kind (accuracy or perplexity) keyed by (row, order, seed), with the expected
    runs and the benchmark of every order."""

    def __init__(self, records: dict[Key, Record], expected: dict[Key, str], kind: str, bench_of: dict[str, str]):
        self.records, self.expected, self.kind, self.bench_of = records, expected, kind, bench_of
        self._unlearned: dict[str, list[str]] = {}  # per order, computed once (records do not change)
        self.filled: dict[Key, Path] = self._fill_majority()
        """Runs without recorded majority-class rates that took them from a run with the same test rows: the donor's folder."""
        self.plan_claims: list[str] = []
        """The ``claims`` of the ``sweep.json`` plans read, each once, in the plans' order."""
        self.pooled_differences: list[str] = []
        """:func:`config_differences` of the runs pooled per (row, order): said in the report's header."""
        keys = set(records) | set(expected)
        self.rows = sorted({k[0] for k in keys}, key=row_sort_key)
        self.orders = sorted({k[1] for k in keys}, key=order_key)
        self.seeds = sorted({k[2] for k in keys}, key=lambda s: (isinstance(s, str), s if isinstance(s, int) else 0, str(s)))
        present = {bench_of[o] for o in self.orders if o in bench_of}
        self.benchmarks = [b for b in BENCH_ORDER if b in present] + sorted(present - set(BENCH_ORDER))

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, paths: list[Path], order_benchmark: dict[str, str] | None = None) -> Study:
        from surecl.data.cl_benchmark import BENCHMARK_OF_ORDER

        bench_of = dict(BENCHMARK_OF_ORDER)  # the built-in orders' benchmarks, then the plans', then the caller's
        found = read_results(paths)
        kind = one_metric(found)
        records: dict[Key, Record] = {}
        cells: dict[tuple[str, str], list[tuple[object, dict]]] = defaultdict(list)
        for f, r in found:
            try:
                cfg = r["config"]
                row = str(cfg.get("preset") or cfg["method"])
                order, seed = str(cfg["data"]["order"]), _seed(cfg["seed"])
            except (KeyError, TypeError):
                raise SureclError(f"report: {f} has no config with preset/method, data.order and seed") from None
            cells[(row, order)].append((seed, _as_run(r)))
            variants = [(row, r)]
            if isinstance(r.get("fast"), dict):
                variants.append((row + FAST, r["fast"]))
            for name, src in variants:
                key = (name, order, seed)
                if key in records:
                    raise SureclError(f"report: two runs of row {name!r}, order {order}, seed {seed}: {records[key].path} and {f.parent}; report them separately")
                records[key] = Record(name, order, seed, {m: src.get(m) for m in METRICS}, f.parent,
                                      list(r.get("tasks") or []), src.get("accuracy_matrix"), host_key(r),
                                      _run_seconds(r), _run_threads(r), data_draw(r), host_moved(r),
                                      r.get("majority") if isinstance(r.get("majority"), dict) else None,
                                      _probe_of(r, fast=name != row), cfg, _run_seconds(r, "cpu"), one_stage(src),
                                      _fingerprints(r))
        # expected runs: the plans, then every combination seen among runs no plan covers
        expected: dict[Key, str] = {}
        plan_dirs = []
        plan_claims: list[str] = []
        for p in paths:
            p = Path(p)
            for plan_path in sorted(p.rglob(PLAN_FILE)) if p.is_dir() else []:
                plan = read_plan(plan_path)
                if plan is None:
                    continue
                plan_dirs.append(plan_path.parent.resolve())
                plan_claims += [c for c in plan.get("claims") or [] if c not in plan_claims]
                for o, b in (plan.get("order_benchmark") or {}).items():
                    bench_of[str(o)] = str(b)
                for e in plan["runs"]:
                    where = str(plan_path.parent / e["path"])
                    expected[(str(e["row"]), str(e["order"]), _seed(e["seed"]))] = where
                    if e.get("dual"):
                        expected[(str(e["row"]) + FAST, str(e["order"]), _seed(e["seed"]))] = where

        def planned(rec: Record) -> bool:
            where = rec.path.resolve()
            return any(d == where or d in where.parents for d in plan_dirs)

        loose = [rec for rec in records.values() if not planned(rec)]
        rows = {r.row for r in loose}
        orders = {r.order for r in loose}
        seeds = {r.seed for r in loose}
        for row in rows:
            for o in orders:
                for s in seeds:
                    expected.setdefault((row, o, s), "")
        bench_of.update({str(o): str(b) for o, b in (order_benchmark or {}).items()})
        st = cls(records, expected, kind, bench_of)
        st.plan_claims = plan_claims
        st.pooled_differences = config_differences(cells) + order_differences(cells, lambda o: st.bench_of.get(o, "other"))
        return st

    def partial_orders(self) -> list[str]:
        """One line per built-in order (1-6) whose runs trained fewer of its tasks than it names:
        which tasks and how many of them (the runs' task lists, as recorded)."""
        from surecl.data.cl_benchmark import ORDERS

        lines = []
        for order in self.orders:
            full = ORDERS.get(order)
            if not full:
                continue
            trained = {t for r in self.records.values() if r.order == order and r.tasks for t in r.tasks}
            absent = [t for t in full if t not in trained]
            if absent and len(absent) < len(full):  # some of the order's tasks (runs of other tasks under its name are no such run)
                lines.append(f"Order-{order}: the runs trained {len(full) - len(absent)} of its {len(full)} tasks; absent: {', '.join(absent)}")
        return lines

    # ---------------------------------------------------------------- tasks learned
    def _fill_majority(self) -> dict[Key, Path]:
        """A run whose results.json predates ``majority`` takes each task's rate from a run of the
        same order and seed that tested the same rows, as both results.json files prove: equal
        ``provenance`` fingerprints of the task (SHA-256 over its train and test rows, so equal
        test rows and so an equal rate). Without fingerprints on both sides the run keeps no rate."""
        donors = sorted(((k, r) for k, r in self.records.items() if r.majority is not None and r.fingerprints),
                        key=lambda kv: str(kv[0]))
        filled: dict[Key, Path] = {}
        for key, rec in sorted(self.records.items(), key=lambda kv: str(kv[0])):
            if rec.majority is not None or not rec.fingerprints or not rec.tasks:
                continue
            rates: dict[str, float | None] = {}
            for task in rec.tasks:
                mine = rec.fingerprints.get(task)
                for _, d in donors:
                    if d.order == rec.order and d.seed == rec.seed and mine and d.fingerprints.get(task) == mine and task in d.majority:
                        rates[task] = d.majority[task]
                        filled[key] = d.path
                        break
            if rates:
                rec.majority = rates
        return filled

    def task_rates(self, order: str) -> list[TaskRate]:
        """Per task of ``order`` (runs that recorded majority-class rates): the rate of its test
        set (mean and range over the runs: with independent draws every run has its own) and the
        best row: the one whose accuracy right after learning the task stands highest above its
        own run's rate, mean over its seeds; and the runs that train it with no rate for it
        (``unjudged``: whether they learned it is unknown)."""
        recs = [r for r in self.records.values() if r.order == order and r.matrix and r.tasks]
        if not any(r.majority for r in recs):
            return []
        tasks = list(dict.fromkeys(t for r in recs if r.majority for t in r.tasks))  # every run's tasks, by name (runs may train other lists)
        out = []
        for task in tasks:
            rates: list[float] = []
            by_row: dict[str, list[tuple[float, float]]] = defaultdict(list)
            unjudged: list[tuple[str, int | str]] = []
            for r in recs:
                if task not in r.tasks:
                    continue
                if r.majority is None or task not in r.majority:  # no rate recorded (nor proven from another run)
                    if not r.row.endswith(FAST):  # a dual run's fast row is the same run
                        unjudged.append((r.row, r.seed))
                    continue
                j = r.tasks.index(task)
                rate = r.majority.get(task)
                if not isinstance(rate, (int, float)) or isinstance(rate, bool) or j >= len(r.matrix[-1]):
                    continue
                if not r.row.endswith(FAST):  # a dual run's fast row is the same run: its rate once
                    rates.append(float(rate))
                # right after learning task j; a joint run (MTL) has only its last row
                right_after = r.matrix[j][j] if j < len(r.matrix) else None
                v = right_after if right_after is not None else r.matrix[-1][j]
                if v is not None:
                    by_row[r.row].append((v, float(rate)))
            if not rates:
                continue
            best = max(((fmean(v - m for v, m in pairs), fmean(v for v, _ in pairs), row) for row, pairs in by_row.items()),
                       default=(None, None, None))
            out.append(TaskRate(task, fmean(rates), min(rates), max(rates), best[1], best[2], best[0],
                                tuple(sorted(unjudged, key=lambda x: (row_sort_key(x[0]), str(x[1]))))))
        return out

    def _planned_pairs(self, a: str, b: str, group: str, skip: set[str] = frozenset()) -> set[tuple[str, object]]:
        """The (order, seed) pairs at which both rows are expected, over benchmark ``group``."""
        return {(o, s) for (row, o, s) in self.expected if row == a and (b, o, s) in self.expected and o not in skip
                and (group == "all" or self.bench_of.get(o, "other") == group)}

    def planned_orders(self, a: str, b: str, group: str, skip: set[str] = frozenset()) -> set[str]:
        """The orders of benchmark ``group`` at which both rows are expected (a seed unit needs a
        pair on each: MTL planned on s3 but not run there yet has no whole seed)."""
        return {o for o, _ in self._planned_pairs(a, b, group, skip)}

    def planned_units(self, a: str, b: str, group: str, kind: str, skip: set[str] = frozenset()) -> int:
        """How many units a claim "a > b" would have over benchmark ``group`` ("all": every
        order) with every expected run present (the sweeps' plans, or every combination seen):
        (order, seed) pairs, or for seed units the seeds with both rows at every such order;
        the orders in ``skip`` (no learned task: they give the claim nothing) left out."""
        both = self._planned_pairs(a, b, group, skip)
        if kind in ORDER_UNITS:
            return len(both)
        orders = {o for o, _ in both}
        seeds = {s for _, s in both}
        return sum(1 for s in seeds if all((o, s) in both for o in orders))

    def unlearned(self, order: str) -> list[str]:
        """Tasks of ``order`` that no row learns above their majority-class rate (the best row's
        accuracy right after learning them less its own run's rate, mean over seeds, at most 1 point),
        judged on every run that trains them (a run with no rate for a task keeps the task in)."""
        if order not in self._unlearned:
            self._unlearned[order] = [t.task for t in self.task_rates(order) if not t.learned and t.judged]
        return self._unlearned[order]

    # ---------------------------------------------------------------- cells
    def value(self, key: Key, metric: str) -> float | None:
        rec = self.records.get(key)
        return None if rec is None else rec.values.get(metric)

    def not_applicable(self, key: Key, metric: str) -> str | None:
        """Why the run at ``key`` has no ``metric`` by design (a key of :data:`NOT_APPLICABLE_WHY`),
        or None: a stream metric of a one-stage run ("joint"), average incremental accuracy left
        null by a run that evaluated only what ``eval.matrix=fp_ap`` evaluates ("fp_ap")."""
        rec = self.records.get(key)
        if rec is None:
            return None
        if rec.joint and metric in STREAM_ONLY:
            return "joint"
        ev = (rec.config or {}).get("eval")
        matrix = ev.get("matrix") if isinstance(ev, dict) else None
        if metric in DIAGONAL_ONLY and matrix == "fp_ap" and rec.values.get(metric) is None:
            return "fp_ap"  # (a stream of one or two tasks under fp_ap has every cell, and its value)
        return None

    def applies(self, key: Key, metric: str) -> bool:
        """Whether ``metric`` is one the run at ``key`` has (or would have, when absent): not a
        metric its null is by design for (:meth:`not_applicable`), which is no missing value."""
        return self.not_applicable(key, metric) is None

    def blank_by_design(self, row: str, orders: list[str], metric: str) -> bool:
        """Whether ``row`` has runs on ``orders`` and none of them has ``metric`` by design
        (:meth:`not_applicable`): its cell is "-" for that reason, not for want of runs."""
        keys = [k for k in self.records if k[0] == row and k[1] in orders]
        return bool(keys) and all(self.not_applicable(k, metric) for k in keys)

    def lacks(self, key: Key, metric: str) -> bool:
        """Whether an expected run's ``metric`` is missing (absent, or null where it applies)."""
        return self.value(key, metric) is None and self.applies(key, metric)

    def claim_value(self, key: Key, metric: str) -> float | None:
        """The value a claim compares: ``metric``, except for an order with tasks no row learns
        above their majority class (:meth:`unlearned`), where it is the metric over the learned
        tasks only (:func:`surecl.metrics.summarise` with ``keep``; None when none is learned)."""
        rec = self.records.get(key)
        if rec is None or not self.applies(key, metric):
            return None
        skip = set(self.unlearned(rec.order))
        if not skip or not rec.matrix or not rec.tasks:
            return rec.values.get(metric)
        keep = [j for j, t in enumerate(rec.tasks) if t not in skip]
        return summarise(rec.matrix, self.kind != "perplexity", keep=keep).get(metric) if keep else None

    def missing(self, metric: str, rows: list[str] | None = None) -> list[Missing]:
        rows_set = set(self.rows if rows is None else rows)
        out = []
        for key, where in self.expected.items():
            if key[0] not in rows_set or not self.lacks(key, metric):
                continue
            row, order, seed = key
            if key in self.records:
                why = f"{metric} is null in results.json"
            elif row.endswith(FAST) and (row[: -len(FAST)], order, seed) in self.records:
                why = "results.json has no 'fast' section"
            else:
                why = "no results.json"
            out.append(Missing(row, order, seed, where, why))
        return sorted(out, key=lambda m: (row_sort_key(m.row), order_key(m.order), str(m.seed)))

    def missing_runs(self, metric: str, rows: list[str] | None = None) -> list[Missing]:
        """:meth:`missing`, with a run whose row and fast row both lack results named once."""
        miss = self.missing(metric, rows)
        keys = {(m.row, m.order, m.seed) for m in miss}
        out = []
        for m in miss:
            if m.row.endswith(FAST) and (m.row[: -len(FAST)], m.order, m.seed) in keys:
                continue
            if (m.row + FAST, m.order, m.seed) in keys:
                m = Missing(f"{m.row} (and its fast row)", m.order, m.seed, m.path, m.why)
            out.append(m)
        return out

    def order_cell(self, row: str, order: str, metric: str) -> Cell:
        per_seed = {}
        for s in self.seeds:
            v = self.value((row, order, s), metric)
            if v is not None:
                per_seed[s] = v
        incomplete = any(self.lacks(k, metric) for k in self.expected if k[0] == row and k[1] == order)
        return Cell(fmean(per_seed.values()) if per_seed else None, per_seed, incomplete)

    def group_orders(self) -> list[tuple[str, list[str]]]:
        """(benchmark, its orders in the runs) per benchmark, then each order of no benchmark."""
        groups = [(b, [o for o in self.orders if self.bench_of.get(o) == b]) for b in self.benchmarks]
        return groups + [(o, [o]) for o in self.orders if o not in self.bench_of]

    def mean_matrix(self, row: str, order: str) -> tuple[list[str], list[list[float | None]], int] | None:
        """The accuracy (or perplexity) matrix of ``row`` on ``order`` averaged entry by entry
        over its seeds: (tasks, matrix, number of seeds); None without a full square matrix (a
        one-stage method such as MTL has its last row alone, not a matrix)."""
        mats = []
        for (r, o, _), rec in sorted(self.records.items(), key=lambda kv: str(kv[0])):
            m = rec.matrix
            if r == row and o == order and rec.tasks and not rec.joint and isinstance(m, list) and len(m) == len(rec.tasks) > 1 \
                    and all(isinstance(x, list) and len(x) == len(rec.tasks) for x in m):
                mats.append((rec.tasks, m))
        if not mats or any(t != mats[0][0] for t, _ in mats):
            return None
        tasks, n = mats[0][0], len(mats[0][0])

        def mean(i: int, j: int) -> float | None:
            vals = [m[i][j] for _, m in mats if m[i][j] is not None]
            return fmean(vals) if vals else None

        return tasks, [[mean(i, j) for j in range(n)] for i in range(n)], len(mats)

    def pooled_cell(self, row: str, metric: str) -> Cell:
        vals = [self.value(k, metric) for k in sorted(self.records, key=str) if k[0] == row]
        vals = [v for v in vals if v is not None]
        incomplete = any(self.lacks(k, metric) for k in self.expected if k[0] == row)
        return Cell(fmean(vals) if vals else None, {}, incomplete, pooled=vals)


# --------------------------------------------------------------------------- rendering


def _digits(kind: str) -> int:
    return 2 if kind == "perplexity" else 1


def _metric_unit(kind: str) -> str:
    """The unit a study's scores are in: ``accuracy %``, ``ROUGE-L (F, x100)``, ``exact match
    %``, ``perplexity``, or for a stream whose tasks differ, ``each task's metric, 0-100``."""
    if kind.startswith("mixed"):
        return "each task's metric, 0-100"
    return {"accuracy": "accuracy %", "exact_match": "exact match %", "rouge_l": "ROUGE-L (F, x100)"}.get(kind, kind)


def _unit(metric: str, kind: str) -> str:
    unit = _metric_unit(kind)
    if metric == "forgetting":
        how = "FP − AP" if kind == "perplexity" else "AP − FP"
        return f"{unit}, {how}, lower is better"
    return f"{unit}, {'higher' if higher_is_better(metric, kind) else 'lower'} is better"


def fmt_cell(c: Cell, d: int, show_n: bool = False) -> str:
    if c.mean is None:
        return "-"
    s = f"{c.mean:.{d}f}" + (f" ± {c.std:.{d}f}" if c.std is not None else "")
    if show_n:
        more = len(c.mean_seeds) if c.mean_seeds is not None and len(c.mean_seeds) > c.n else 0
        s += f" (n={c.n}; mean over {more} seeds)" if more else f" (n={c.n})"
    return s + (f" {DAGGER}" if c.incomplete else "")


def _md(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in s.lower()).strip("_")


def _stems(prefix: str, names: list[str], positions: list[int] | None = None) -> dict[str, str]:
    """A file stem per name: ``prefix`` + its slug where no other name has that slug, else
    (names differing only in case, or in characters the slug replaces: orders ``s1`` and ``S1``,
    ``a+b`` and ``a_b``) the slug and ``_<position>``, the name's place (1-based) in ``names`` or
    as ``positions`` gives it, so that no name's file replaces another's."""
    slugs = [prefix + _slug(n) for n in names]
    count = {s: slugs.count(s) for s in slugs}
    taken = {s for s in slugs if count[s] == 1}
    out = {}
    for name, stem, pos in zip(names, slugs, positions or range(1, len(names) + 1)):
        if count[stem] > 1:
            base = stem = f"{stem}_{pos}"
            n = 1
            while stem in taken:  # another name's own stem (an order named "s1_2" beside s1 and S1)
                n += 1
                stem = f"{base}_{n}"
            taken.add(stem)
        out[name] = stem
    return out


def _csv(rows: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _cell_csv(c: Cell) -> list:
    return ["" if c.mean is None else round(c.mean, 6), "" if c.std is None else round(c.std, 6), c.n, int(not c.incomplete and c.mean is not None)]


def _footer(missing: list[Missing], empty: list[str], limit: int = 30) -> str:
    lines = []
    if missing:
        names = [f"{m.row} order {m.order} seed {m.seed}" for m in missing]
        more = f"; … and {len(names) - limit} more" if len(names) > limit else ""
        lines.append(f"{DAGGER} incomplete: computed from fewer runs than expected ({len(missing)} values missing: a dual run's slow and fast rows count "
                     "apart; the runs are under \"Missing runs\"): "
                     + "; ".join(names[:limit]) + more + ".")
    if empty:  # a study's grid rows leave most cells unplanned: name a few, count the rest
        more = f"; … and {len(empty) - limit} more" if len(empty) > limit else ""
        lines.append("Cells \"-\" have no runs at all: " + "; ".join(empty[:limit]) + more + ".")
    return "\n\n".join(lines)


@dataclass
class Table:
    name: str  # file stem: main, forgetting, ablation_<key>, claims, timing, missing
    title: str
    markdown: str  # caption + table + footer
    csv: str
    png: bytes | None = None


@dataclass
class PaperReport:
    study: Study
    metric: str = "fp"
    fast: bool = True
    claims: list[tuple[str, str]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    heatmaps: list[tuple[str, str, bytes]] = field(default_factory=list)
    """(file stem, caption, PNG) per order: each row's accuracy matrix averaged over seeds."""

    @property
    def shown_rows(self) -> list[str]:
        return [r for r in self.study.rows if self.fast or not r.endswith(FAST)]

    def markdown(self, images: bool = False) -> str:
        st = self.study
        n_missing = len(st.missing_runs(self.metric, self.shown_rows))
        head = [f"# surecl report: {_LABEL[self.metric]} ({_unit(self.metric, st.kind)})", "",
                f"{len(st.records)} result rows ({sum(1 for r in st.records if not r[0].endswith(FAST))} runs), "
                f"orders {', '.join(st.orders)}, seeds {_seed_words(st)}."]
        draws = sorted({r.draw for r in st.records.values()})
        draw_words = {"run": "data.draw=run (every (order, seed) run independent: its data and random streams)",
                      "order": "data.draw=order (every (order, seed) run draws its own data; the runs of one seed share its "
                               "LoRA init, batch order and replay draws)",
                      "shared": "data.draw=shared or unrecorded (the orders of a seed share their samples: the seed is the unit)"}
        head += ["", "**Conventions.** Every ± is a sample standard deviation (n − 1 denominator) over runs: over the seeds of "
                 "an order in the order columns, over each seed's average across the orders in the average columns, over every "
                 "run of a row (orders and seeds) in the ablation and general-ability tables. Claims pair two rows' runs unit by "
                 "unit (their caption names the unit). Data draws: " + "; ".join(draw_words[d] for d in draws) + "."]
        coupled = _coupled_fast_note(st, self.shown_rows)
        if coupled:
            head += ["", "**Fast rows that are not their method without the slow learner** (a `<row> (fast)` row is a dual "
                     "run's fast adapter; for most methods it trains exactly as the method alone):" + coupled]
        if n_missing:
            head += ["", f"**{n_missing} expected run(s) missing**: cells marked {DAGGER} are computed from fewer runs; see \"Missing runs\"."]
        partial = st.partial_orders()
        if partial:
            head += ["", "**Orders run without some of their tasks** (a benchmark folder lacking them under `data.allow_missing`, or `data.tasks`): "
                     "their columns are not the paper's orders:", "", *(f"- {line}" for line in partial)]
        if st.pooled_differences:
            head += ["", "**Runs pooled into one cell, or into one row's average over a benchmark's orders, differ in "
                     "configuration** (besides the seed and the order; check that each difference is one you meant to pool, "
                     "else report those runs separately):", "",
                     *(f"- {line}" for line in st.pooled_differences)]
        parts = ["\n".join(head)]
        for t in self.tables:
            body = f"## {t.title}\n\n{t.markdown}"
            if images and t.png is not None:
                body += f"\n\n![{t.title}]({t.name}.png)"
            parts.append(body)
        if images and self.heatmaps:
            which = {"accuracy": "Accuracy", "perplexity": "Perplexity"}.get(self.study.kind, "Score")
            parts.append(f"## {which} matrices\n\n" + "\n\n".join(f"{cap}\n\n![{stem}]({stem}.png)" for stem, cap, _ in self.heatmaps))
        return "\n\n".join(parts) + "\n"

    def write(self, out_dir: Path) -> list[Path]:
        """Write every table (.md, .csv, .png), the heatmaps and ``report.md`` into ``out_dir``;
        a file there that an earlier report did not write (``REPORT_MARK`` lists what they did)
        is refused before anything is written."""
        from surecl.checkpoint import _atomic_write_bytes, write_json

        out_dir = Path(out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise SureclError(f"--out-dir: {out_dir} is a file, not a directory")
        files: dict[str, bytes] = {}
        folded: dict[str, str] = {}  # names that are one file on a case-insensitive disk

        def add(name: str, data: bytes) -> None:
            if name.casefold() in folded:
                raise SureclError(f"--out-dir: two parts of this report would both be written to {out_dir / name}"
                                  + (f" ({folded[name.casefold()]} on a case-insensitive disk)" if folded[name.casefold()] != name else "")
                                  + ", one replacing the other; nothing was written")
            folded[name.casefold()] = name
            files[name] = data

        for t in self.tables:
            md = f"## {t.title}\n\n{t.markdown}\n" + (f"\n![{t.title}]({t.name}.png)\n" if t.png is not None else "")
            for name, data in ((f"{t.name}.md", md.encode()), (f"{t.name}.csv", t.csv.encode()), (f"{t.name}.png", t.png)):
                if data is not None:
                    add(name, data)
        for stem, _, png in self.heatmaps:
            add(f"{stem}.png", png)
        add("report.md", self.markdown(images=True).encode())
        ours = _report_files(out_dir)
        for name in files:
            path = out_dir / name
            if (os.path.lexists(path) and name not in ours) or path.is_symlink() or path.is_dir():
                raise SureclError(f"--out-dir: {path} was not written by surecl report and this report would replace it; "
                                  "move it away or choose another --out-dir")
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(out_dir / REPORT_MARK, {"files": sorted(set(ours) | set(files))})  # first: a killed write leaves its files known
        written = []
        for name, data in files.items():
            _atomic_write_bytes(out_dir / name, data)
            written.append(out_dir / name)
        return written


REPORT_MARK = ".surecl-report.json"
"""Lists the files ``surecl report --out-dir`` wrote in a folder (a later report replaces only those)."""


def _report_files(out_dir: Path) -> set[str]:
    """The files earlier reports wrote in ``out_dir``: those ``REPORT_MARK`` lists; in a folder a
    version before the mark wrote (its ``report.md`` a surecl report), the files that report.md
    vouches for: itself, a table ``<name>.md`` whose title line is one of its sections (and the
    table's ``<name>.csv``), and an image it shows. A user's file of another name, or of a table's
    name with other content, is not the report's."""
    mark = out_dir / REPORT_MARK
    if mark.is_file() and not mark.is_symlink():
        try:
            listed = json.loads(mark.read_text(encoding="utf-8")).get("files")
        except (ValueError, OSError, AttributeError, UnicodeDecodeError):
            listed = None
        if not isinstance(listed, list) or not all(isinstance(n, str) and "/" not in n for n in listed):
            raise SureclError(f"--out-dir: {mark} is damaged; move it away or choose another --out-dir")
        return set(listed)
    def text(path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8") if path.is_file() and not path.is_symlink() else ""
        except (OSError, UnicodeDecodeError):
            return ""

    earlier = text(out_dir / "report.md")
    if not earlier.startswith("# surecl report"):
        return set()
    sections = {line for line in earlier.splitlines() if line.startswith("## ")}
    ours = {"report.md"}
    for p in out_dir.iterdir():
        if p.suffix == ".md" and p.name != "report.md" and text(p).split("\n", 1)[0] in sections:
            ours.add(p.name)
            if (out_dir / f"{p.stem}.csv").is_file() and not (out_dir / f"{p.stem}.csv").is_symlink():
                ours.add(f"{p.stem}.csv")
        elif p.suffix == ".png" and p.is_file() and not p.is_symlink() and f"]({p.name})" in earlier:
            ours.add(p.name)
    return ours


def _not_applicable_note(st: Study, metrics: list[str], rows: list[str]) -> str:
    """A sentence per metric and reason naming the rows whose runs leave the metric null by
    design (:meth:`Study.not_applicable`): their cells are "-", or the mean of their other runs,
    and the runs are not missing. "" when there are none."""
    found: dict[tuple[str, str], set[str]] = defaultdict(set)  # (metric, why) -> rows
    for key in st.records:
        for m in metrics:
            why = st.not_applicable(key, m) if key[0] in rows else None
            if why:
                found[(m, why)].add(key[0])
    said: dict[tuple[str, tuple[str, ...]], list[str]] = defaultdict(list)  # (why, rows) -> metrics, in the table's order
    for m in metrics:
        for (m2, why), which in sorted(found.items(), key=lambda kv: kv[0][1]):
            if m2 == m:
                said[(why, tuple(sorted(which, key=row_sort_key)))].append(_LABEL[m])
    return "".join(f" {' and '.join(ms)} {'does' if len(ms) == 1 else 'do'} not apply to the runs of {', '.join(which)} "
                   f"({NOT_APPLICABLE_WHY[why]}): results.json leaves {'it' if len(ms) == 1 else 'them'} null by design, "
                   "so they are not missing runs." for (why, which), ms in said.items())


def _coupled_fast_note(st: Study, rows: list[str]) -> str:
    """A sentence per kind naming the fast rows among ``rows`` that are not their method without
    the slow learner (the method's ``fast_is_solo`` False: I-LoRA's plastic adapter, trained
    with the slow one's consistency term), in the method's words; "" when there are none."""
    from surecl.methods.base import fast_words

    said: dict[str, list[str]] = defaultdict(list)  # words -> rows
    for row in rows:
        if not row.endswith(FAST):
            continue
        methods = sorted({str(rec.config.get("method")) for key, rec in st.records.items() if key[0] == row and isinstance(rec.config, dict)})
        for words in dict.fromkeys(fast_words(m) for m in map(method_of, methods) if m is not None and not m.fast_is_solo):
            said[words].append(row)
    return "".join(f" {', '.join(which)}: {words}." for words, which in said.items())


def main_table(st: Study, metric: str, rows: list[str]) -> Table:
    d = _digits(st.kind)
    cols: list[tuple[str, str]] = [(f"Order-{o}" if o.isdigit() else o, f"order_{o}") for o in st.orders]
    col_orders = [[o] for o in st.orders]  # the orders behind each column
    bench_orders = dict(st.group_orders()[: len(st.benchmarks)])
    for b in st.benchmarks:
        all_of_b = sorted((o for o, x in st.bench_of.items() if x == b), key=order_key)
        label = f"{b} avg" + ("" if bench_orders[b] == all_of_b else f" ({', '.join(bench_orders[b])})")
        cols.append((label, f"{_slug(b)}_avg"))
        col_orders.append(bench_orders[b])
    if len(st.benchmarks) > 1:
        cols.append(("All avg", "all_avg"))
        col_orders.append(st.orders)
    elif not st.benchmarks and len(st.orders) > 1:
        cols.append(("avg", "avg"))
        col_orders.append(st.orders)
    grid: dict[str, list[Cell]] = {}
    for row in rows:
        by_order = {o: st.order_cell(row, o, metric) for o in st.orders}
        cells = [by_order[o] for o in st.orders]
        benches = [average_cells([by_order[o] for o in bench_orders[b]]) for b in st.benchmarks]
        cells += benches
        if len(st.benchmarks) > 1:
            cells.append(average_cells(benches))
        elif not st.benchmarks and len(st.orders) > 1:
            cells.append(average_cells(cells))
        grid[row] = cells
    ns = {c.n for cells in grid.values() for c in cells if c.mean is not None}
    wider = any(c.mean_seeds is not None and len(c.mean_seeds) > c.n for cells in grid.values() for c in cells if c.mean is not None)
    show_n = len(ns) > 1 or wider
    body = [[row] + [fmt_cell(c, d, show_n) for c in cells] for row, cells in grid.items()]
    seeds = f"n = {ns.pop()} seed(s) per cell" if len(ns) == 1 else "n = seeds per cell, shown where they differ"
    caption = f"{_LABEL[metric]} ({_unit(metric, st.kind)}): mean ± {STD_WORDS} ({seeds})."
    if len(cols) > len(st.orders):
        caption += (" Averages over orders are means of the per-order means; their ± is the sample std over seeds of each seed's "
                    "average (the seeds present in every order averaged)" + (
                        "; \"n=k; mean over m seeds\": the mean has runs of m seeds, some missing from an order, "
                        "the ± only the k in every order." if wider else "."))
    if len(st.benchmarks) > 1:
        caption += " All avg = mean of the benchmark averages."
    caption += _not_applicable_note(st, [metric], rows) + _coupled_fast_note(st, rows)
    empty = [f"{row} {name}" for row, cells in grid.items() for (name, _), c, os_ in zip(cols, cells, col_orders)
             if c.mean is None and not c.incomplete and not st.blank_by_design(row, os_, metric)]
    foot = _footer(st.missing(metric, rows), empty)
    md = caption + "\n\n" + _md(["method"] + [c[0] for c in cols], body) + ("\n\n" + foot if foot else "")
    csv_rows = [["row"] + [f"{slug}_{s}" for _, slug in cols for s in ("mean", "std", "n", "complete")]]
    csv_rows += [[row] + [x for c in cells for x in _cell_csv(c)] for row, cells in grid.items()]
    return Table("main", "Main table", md, _csv(csv_rows))


def forgetting_table(st: Study, rows: list[str]) -> Table:
    d = _digits(st.kind)
    how = "FP − AP" if st.kind == "perplexity" else "AP − FP"
    groups = st.group_orders()
    metrics = ("ap", "fp", "forgetting")
    header = ["method"] + [f"{g} {_LABEL[m]}" for g, _ in groups for m in metrics]
    body, csv_rows = [], [["row"] + [f"{_slug(g)}_{m}_{s}" for g, _ in groups for m in metrics for s in ("mean", "std", "n", "complete")]]
    empty = []
    for row in rows:
        cells = [average_cells([st.order_cell(row, o, m) for o in orders]) for _, orders in groups for m in metrics]
        body.append([row] + [fmt_cell(Cell(c.mean, {}, c.incomplete), d) for c in cells])
        csv_rows.append([row] + [x for c in cells for x in _cell_csv(c)])
        empty += [f"{row} {g}" for (g, _), c in zip(groups, cells[::3]) if c.mean is None and not c.incomplete]
    unit = _metric_unit(st.kind)
    caption = (f"AP, FP and forgetting = {how} ({unit}; forgetting: lower is better) per benchmark: mean over its orders "
               "(each order's mean over seeds). The CSV's std is the sample std (n − 1) over seeds of each seed's average "
               "over the orders, as in the main table.") + _not_applicable_note(st, list(metrics), rows) + _coupled_fast_note(st, rows)
    missing = sorted({(m.row, m.order, str(m.seed)): m for met in metrics for m in st.missing(met, rows)}.values(),
                     key=lambda m: (row_sort_key(m.row), order_key(m.order), str(m.seed)))
    foot = _footer(missing, empty)
    return Table("forgetting", "Forgetting", caption + "\n\n" + _md(header, body) + ("\n\n" + foot if foot else ""), _csv(csv_rows))


def ablation_tables(st: Study, metric: str, rows: list[str]) -> list[Table]:
    d = _digits(st.kind)
    keys = sorted({k for r in rows for k, _ in parse_row(r)[1]})
    stems = _stems("ablation_", keys)  # keys differing in case only: one file each
    tables = []
    for key in keys:
        cells: dict[tuple[str, str], tuple[str, Cell]] = {}  # (column, value) -> (row, cell)
        for r in rows:
            method, grid, fast = parse_row(r)
            g = dict(grid)
            if key not in g:
                continue
            col = " ".join([method, *(f"{k}={v}" for k, v in grid if k != key)]) + (FAST if fast else "")
            cells[(col, g[key])] = (r, st.pooled_cell(r, metric))
        cols = sorted({c for c, _ in cells}, key=row_sort_key)
        values = sorted({v for _, v in cells}, key=_num)
        body, empty = [], []
        csv_rows = [[key] + [f"{c} {s}" for c in cols for s in ("mean", "std", "n", "complete")]]
        ns = {c.n for _, c in cells.values() if c.mean is not None}
        for v in values:
            line, cline = [v], [v]
            for c in cols:
                row, cell = cells.get((c, v), (None, Cell(None)))
                line.append(fmt_cell(cell, d, len(ns) > 1))
                cline += _cell_csv(cell)
                if cell.mean is None and not cell.incomplete and not (row and st.blank_by_design(row, st.orders, metric)):
                    empty.append(f"{c} at {key}={v}")
            body.append(line)
            csv_rows.append(cline)
        abl_rows = [r for r, _ in cells.values()]
        caption = (f"{_LABEL[metric]} ({_unit(metric, st.kind)}) against {key}: mean ± sample std over all orders and seeds "
                   f"of each point (orders {', '.join(sorted({k[1] for k in st.records if k[0] in abl_rows}, key=order_key))})."
                   + _not_applicable_note(st, [metric], abl_rows) + _coupled_fast_note(st, abl_rows))
        foot = _footer(st.missing(metric, abl_rows), empty)
        md = caption + "\n\n" + _md([key] + cols, body) + ("\n\n" + foot if foot else "")
        png = _ablation_png(key, values, cols, cells, metric, st.kind)
        tables.append(Table(stems[key], f"Ablation: {key}", md, _csv(csv_rows), png))
    return tables


def _ablation_png(key: str, values: list[str], cols: list[str], cells: dict, metric: str, kind: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numeric = all(_num(v)[0] == 0 for v in values)
    xs = [float(v) for v in values] if numeric else list(range(len(values)))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for c in cols:
        pts = [(x, cells[(c, v)][1]) for x, v in zip(xs, values) if (c, v) in cells and cells[(c, v)][1].mean is not None]
        if not pts:
            continue
        ax.errorbar([x for x, _ in pts], [p.mean for _, p in pts], yerr=[p.std or 0.0 for _, p in pts],
                    marker="o", capsize=3, label=c)
    if not numeric:
        ax.set_xticks(xs, values)
    ax.set_xlabel(key)
    ax.set_ylabel(f"{_LABEL[metric]} ({_metric_unit(kind)})")
    ax.set_title(f"{_LABEL[metric]} vs {key} (mean ± sample std over orders and seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # an axis whose runs are all missing plots nothing
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig, dpi=120)


# --------------------------------------------------------------------------- claims

_SURPRISE = ("slow_surprise" + FAST, "surprise")
_RESERVOIR = ("slow_reservoir" + FAST, "reservoir")


def default_claims(rows: list[str]) -> list[tuple[str, str]]:
    """The paper's claims whose two rows are both in the runs: surprise > reservoir (the
    fast adapters of the slow_* runs, or the single-learner runs), slow > fast (also for every
    row of a ``dual.*`` grid point: another EMA rule), slow_surprise > seq_lora."""
    have = set(rows)
    out = [(s, r) for s, r in zip(_SURPRISE, _RESERVOIR) if s in have and r in have]
    if not out:
        s = next((x for x in _SURPRISE if x in have), None)
        r = next((x for x in _RESERVOIR if x in have), None)
        if s and r:
            out.append((s, r))
    out += [(m, m + FAST) for m in ("slow_surprise", "slow_reservoir") if m in have and m + FAST in have]
    # a row that varies the slow learner itself (a dual.* grid point) tests slow > fast too
    out += [(r, r + FAST) for r in rows if not r.endswith(FAST) and r + FAST in have
            and parse_row(r)[1] and all(k.startswith("dual.") for k, _ in parse_row(r)[1])]
    if "slow_surprise" in have and "seq_lora" in have:
        out.append(("slow_surprise", "seq_lora"))
    return out


def split_claim(text: str, where: str = "--claim") -> tuple[str, str]:
    """``"A>B"`` (A better than B) or ``"A<B"`` (B better than A) as (better, worse), its form
    alone checked (``where`` names the option or plan key in the message)."""
    if not isinstance(text, str):
        raise SureclError(f"{where} {text!r} must be a text like 'A>B' (A better than B)")
    ops = [c for c in text if c in "<>"]
    if len(ops) != 1:
        raise SureclError(f"{where} {text!r} must look like 'A>B' (A better than B) with one '>' or '<'")
    a, b = (s.strip() for s in text.split(ops[0]))
    if not a or not b:
        raise SureclError(f"{where} {text!r} must name a row on each side of {ops[0]!r}")
    if ops[0] == "<":
        a, b = b, a
    if a == b:
        raise SureclError(f"{where} {text!r} compares a row with itself")
    return a, b


def parse_claim(text: str, rows: list[str], where: str = "--claim") -> tuple[str, str]:
    """``"A>B"`` (A better than B) or ``"A<B"`` (B better than A), row names as in the table."""
    a, b = split_claim(text, where)
    for name in (a, b):
        if name not in rows:
            raise SureclError(f"{where} {text!r}: no row {name!r} in the runs (rows: {', '.join(rows)})")
    return a, b


MIN_SAME_HOST = 3
"""Fewest same-host units for a claim to be computed on same-host units only."""

ORDER_UNITS = ("order", "run")
"""The claim unit kinds whose unit is each (order, seed) pair (the runs' ``data.draw``)."""

def _seed_words(st: Study) -> str:
    """The seeds the finished runs have, and those the sweep plans beyond them (a study still
    running): ``0, 1, 2, 3 (planned: 4)``."""
    have = {k[2] for k in st.records}
    planned = [s for s in st.seeds if s not in have]
    words = ", ".join(str(s) for s in st.seeds if s in have) or "none finished"
    return words + (f" (planned: {', '.join(map(str, planned))})" if planned else "")


_UNIT_WORDS = {"run": "(order, seed) (independent runs, data.draw=run: each draws its own data, LoRA init, batch order and "
                      "replay draws)",
               "order": "(order, seed) (independent data draws, data.draw=order; the runs of one seed share its LoRA init, "
                        "batch shuffling and replay random streams across orders)",
               "seed": "seed (samples shared across orders, data.draw=shared)",
               "seed_asked": "seed (--unit seed: each seed's pairs averaged over its orders, whatever the runs' draws)",
               "mixed": "seed (data.draw differs between the runs; shared samples make the seed the unit)"}


@dataclass
class _Pair:
    order: str
    seed: int | str
    diff: float  # A - B
    where: str  # "same" | "other" | "unrecorded": the hosts of the pair's two runs
    draw: str  # "run" / "order" when both runs drew so (one of each: "order"), else "shared"


def claim_units(pairs: list[_Pair]) -> tuple[str, list[tuple[str, float, str]]]:
    """The independent units of one claim: (unit kind, [(label, A - B, host relation)]).

    With every pair's runs drawn per (order, seed) (``data.draw=order``) each pair is a unit
    ("order"); otherwise a seed's runs share their samples across orders, so the pairs of one seed
    are averaged into one unit ("seed", or "mixed" where the draws differ). A seed unit is
    cross-host ("other") when any of its pairs is, unrecorded when any is (and none is cross-host),
    else same-host."""
    if not pairs:
        return "none", []
    draws = {p.draw for p in pairs}
    if draws <= set(ORDER_UNITS):
        return ("run" if draws == {"run"} else "order"), [(f"{p.order}/{p.seed}", p.diff, p.where) for p in pairs]
    by_seed: dict[int | str, list[_Pair]] = defaultdict(list)
    for p in pairs:
        by_seed[p.seed].append(p)
    units = []
    for seed in sorted(by_seed, key=lambda s: (isinstance(s, str), s if isinstance(s, int) else 0, str(s))):
        ps = by_seed[seed]
        wheres = {p.where for p in ps}
        where = "other" if "other" in wheres else "unrecorded" if "unrecorded" in wheres else "same"
        units.append((str(seed), fmean(p.diff for p in ps), where))
    return ("seed" if draws == {"shared"} else "mixed"), units


def claim_units_complete(pairs: list[_Pair], orders: set[str] | None = None) -> tuple[str, list[tuple[str, float, str]], int]:
    """:func:`claim_units`, where a seed unit (shared samples) counts only with a pair on every
    one of ``orders`` (the orders of the claim's benchmark group at which both rows are planned;
    default: the orders the pairs have): a seed with one order of three would be another
    quantity. The third value is the number of seeds left out for lacking one."""
    kind, units = claim_units(pairs)
    if kind in (*ORDER_UNITS, "none"):
        return kind, units, 0
    orders = set(orders) if orders is not None else {p.order for p in pairs}
    by_seed: dict[int | str, set[str]] = defaultdict(set)
    for p in pairs:
        by_seed[p.seed].add(p.order)
    whole = {seed for seed, os in by_seed.items() if os == orders}
    kind, units = claim_units([p for p in pairs if p.seed in whole])
    return (kind if units else "seed"), units, len(by_seed) - len(whole)


def _row_keys(row: str) -> set[str] | None:
    """The config keys that define a row (a claim's two rows may differ in them): its method
    preset's keys (the row's first word: a method preset, whose keys it sets) and the grid keys
    it names (``slow_surprise dual.beta=0.999``), with ``method``, ``preset`` and ``seed``. None
    when the first word is no method preset here (a user's YAML file): unknown keys."""
    from surecl.config import load_yaml

    words = row.split()
    keys = {"method", "preset", "seed"} | {w.split("=", 1)[0] for w in words[1:] if "=" in w}
    try:
        body, _ = load_yaml(words[0]) if words else ({}, "")
    except SureclError:
        return None
    if body.get("kind", "method") != "method" or Path(words[0]).suffix in (".yaml", ".yml"):
        return None
    return keys | set(_flat_config({k: v for k, v in body.items() if k not in ("kind", "description")}))


def pair_confounds(ca: dict, cb: dict, allowed: set[str]) -> list[str]:
    """The config keys two runs of a claim's pair differ in besides ``allowed`` (their rows' own
    keys), as far as the runs read them (:func:`surecl.config.read_view`); a key one run did not
    record (written before it existed) is not compared."""
    fa, fb = _flat_config(read_view([ca, cb])), _flat_config(read_view([cb, ca]))
    return sorted(k for k in set(fa) & set(fb) if fa[k] != fb[k] and k not in allowed and k not in CLAIM_KEYS_FREE)


CLAIM_KEYS_FREE = ("data.order", "data.tasks")
"""Keys a pair's runs share by construction (one (order, seed) unit) or that name it."""


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def claims_table(st: Study, metric: str, claims: list[tuple[str, str]], level: float = 0.95, unit: str = "auto",
                 absent: list[tuple[str, str]] | None = None) -> Table:
    """Paired claims "A > B" per benchmark group: the independent units (see :func:`claim_units`;
    ``unit="seed"``: the seed whatever the runs' draws, each seed's pairs averaged over its orders),
    same-host units only where at least :data:`MIN_SAME_HOST` exist, the Student-t interval, the
    paired t-test's raw p-value, its Holm adjustment over every claim row of the table,
    the exact sign test, and the verdict from the Holm-adjusted p-value at 1 − ``level``.
    ``absent``: the plans' claims left out, each with why (a row of theirs no sweep here planned,
    or a fast row of a row whose runs are not dual), said in the caption."""
    from surecl.stats import NO_SPREAD_WHY, holm, p_verdict, paired, sign_test

    d = _digits(st.kind) + 1
    up = higher_is_better(metric, st.kind)
    alpha = round(1.0 - level, 10)
    pct = f"{level * 100:g} %"

    # one entry per (claim, benchmark group); Holm needs every p-value of a group first
    entries: list[dict] = []
    why_na: set[str] = set()  # NOT_APPLICABLE_WHY keys of the pairs left out
    for a, b in claims:
        pairs: dict[tuple[str, int | str], _Pair] = {}
        keys_a, keys_b = _row_keys(a.removesuffix(FAST)), _row_keys(b.removesuffix(FAST))
        allowed = None if keys_a is None or keys_b is None else keys_a | keys_b
        confounds: dict[str, set[str]] = defaultdict(set)  # benchmark group -> keys a pair's runs differ in
        unscored: dict[str, set] = defaultdict(set)  # benchmark group -> orders whose runs are present but learned no task
        inapplicable: dict[str, set] = defaultdict(set)  # benchmark group -> orders whose runs have no such metric by design
        for (row, order, seed), ra in st.records.items():
            rb = st.records.get((b, order, seed))
            if row != a or rb is None:
                continue
            va, vb = st.claim_value((row, order, seed), metric), st.claim_value((b, order, seed), metric)
            if va is None or vb is None:
                na = st.not_applicable((row, order, seed), metric) or st.not_applicable((b, order, seed), metric)
                if na:  # null by design (MTL's stream metrics, fp_ap's average incremental accuracy): not a missing unit
                    inapplicable[st.bench_of.get(order, "other")].add(order)
                    why_na.add(na)
                elif st.unlearned(order) and None not in (ra.values.get(metric), rb.values.get(metric)):
                    unscored[st.bench_of.get(order, "other")].add(order)
                continue
            if ra.path == rb.path:  # one run: its two adapters, one trajectory
                where = "same"
            elif ra.host is None or rb.host is None:
                where = "unrecorded"
            elif ra.host_moved or rb.host_moved or ra.host != rb.host:
                where = "other"
            else:
                where = "same"
            draws = {ra.draw, rb.draw}
            draw = "shared" if "shared" in draws or unit == "seed" else "run" if draws == {"run"} else "order"
            pairs[(order, seed)] = _Pair(order, seed, va - vb, where, draw)
            if ra.path != rb.path and allowed is not None and ra.config and rb.config:
                confounds[st.bench_of.get(order, "other")].update(pair_confounds(ra.config, rb.config, allowed))
            if ra.tasks and rb.tasks and ra.tasks != rb.tasks:  # data.tasks may differ between orders, never within a pair
                confounds[st.bench_of.get(order, "other")].add("the tasks trained")
        groups: dict[str, list[_Pair]] = defaultdict(list)
        for (order, _), pair in sorted(pairs.items(), key=lambda kv: (order_key(kv[0][0]), str(kv[0][1]))):
            groups[st.bench_of.get(order, "other")].append(pair)
        names = [g for g in [*st.benchmarks, "other"] if g in groups]
        if len(names) != 1:
            names.append("all")
        for g in names:
            chosen = [p for ps in groups.values() for p in ps] if g == "all" else groups[g]
            dropped = set().union(*unscored.values()) if g == "all" else unscored.get(g, set())
            na_orders = set().union(*inapplicable.values()) if g == "all" else inapplicable.get(g, set())
            dropped = dropped | na_orders
            required = st.planned_orders(a, b, g, skip=dropped) or None  # the orders both rows are planned on
            kind, units, left_out = claim_units_complete(chosen, required)
            # an order whose runs learned no task gives no unit: not missing, and left out of the planned count
            planned = st.planned_units(a, b, g, kind, skip=dropped)
            same, cross, unrec = (sum(1 for u in units if u[2] == k) for k in ("same", "other", "unrecorded"))
            same_only = same >= MIN_SAME_HOST
            used = [u for u in units if u[2] == "same"] if same_only else units
            diffs = [u[1] for u in used]
            res = paired(diffs, level)
            better = diffs if up else [-x for x in diffs]  # the sign test counts units where A is better
            mixed = sorted(set().union(*confounds.values()) if g == "all" else confounds.get(g, set()))
            entries.append({"a": a, "b": b, "group": g, "kind": kind, "n_all": len(units), "same": same, "cross": cross,
                            "unrec": unrec, "same_only": same_only, "res": res, "sign": sign_test(better),
                            "confounds": mixed, "planned": max(planned, len(units)), "left_out": left_out,
                            "unscored": sorted(dropped - na_orders, key=order_key), "na": sorted(na_orders, key=order_key)})
    # one family: every tested row of this table (each benchmark group's and the "all" rows)
    family_size = sum(1 for x in entries if x["res"].p is not None)
    for e, adj in zip(entries, holm([e["res"].p for e in entries])):
        e["holm"], e["family"] = adj, family_size

    if unit == "seed":
        for e in entries:
            e["kind"] = "seed_asked" if e["kind"] != "none" else e["kind"]
    kinds = sorted({e["kind"] for e in entries if e["kind"] != "none"}, key=["seed", "seed_asked", "mixed", "order", "run"].index)
    show_kind = len(kinds) > 1
    if not kinds:
        unit_words = "unit: seed where samples are shared across orders (data.draw=shared), (order, seed) where every run is an independent draw (data.draw=order or run)"
    elif show_kind:
        unit_words = "unit per row (the n units column): " + "; ".join(_UNIT_WORDS[k] for k in kinds)
    else:
        unit_words = "unit: " + _UNIT_WORDS[kinds[0]]
    side = "above" if up else "below"
    caption = (
        f"{_LABEL[metric]} ({_unit(metric, st.kind)}). \"A > B\" claims A is better. **{unit_words}.** Paired differences "
        "A − B over the runs both rows have; "
        + ("each seed's differences are averaged over its orders (those of the row's benchmark group) into one unit, "
           "whatever the runs' draws (--unit seed). " if kinds == ["seed_asked"] else
           "with shared samples the orders of a seed train and test on the same examples, so a seed's differences are "
           "averaged over its orders (those of the row's benchmark group) into one unit; with independent draws each "
           "(order, seed) pair is a unit. ") +
        f"{pct} two-sided Student-t interval mean ± t·sd/√n (unadjusted); t p: two-sided paired t-test (raw); "
        f"**Holm p**: Holm's step-down adjustment over every claim row of this table (all benchmark groups and their "
        f"\"all\" rows together; claims with n < 2, or whose differences are all equal (no spread), are not tested and not counted); sign test: units where A is better "
        "/ worse (ties dropped) and its exact two-sided binomial p-value. **Verdicts use Holm-adjusted p-values at "
        f"{alpha:g}**: **shown**: Holm p < {alpha:g} and the mean favours A (its interval lies {side} 0 or not: the "
        f"interval is not adjusted); **contradicted**: Holm p < {alpha:g} and the mean favours B; **not shown**: otherwise. "
        "**hosts**: a unit is cross-host when the two runs of any of its pairs recorded different hosts (processor, its "
        "kernel flags, torch version, a CPU run's threads, GPU, base dtype) or a run moved between hosts; the two adapters of one dual run are one "
        "trajectory, same-host; a run from before hosts were recorded is unrecorded. A claim with at least "
        f"{MIN_SAME_HOST} same-host units is computed on those only (\"same-host units only: k of n\"); otherwise on all "
        "units, with the cross-host ones counted. Bf16 and fp32 kernels round differently, so runs on two hosts at one "
        "seed are independent runs.")
    header = ["claim", "benchmark", "n units", "mean diff (A − B)", f"{pct} t-interval", "t p (raw)", "Holm p",
              "sign test (W/L, p)", "verdict", "hosts"]
    body = []
    csv_rows = [["claim", "a", "b", "benchmark", "unit", "n", "n_all", "mean_diff", "sd", "ci_lo", "ci_hi", "t_crit", "t_stat",
                 "t_p", "holm_p", "holm_family", "sign_wins", "sign_losses", "sign_ties", "sign_p", "verdict", "why",
                 "host_basis", "same_host", "other_host", "host_unrecorded", "n_planned", "seeds_left_out", "confounds"]]
    if not claims:
        body.append(["(none: no default claim has both rows in the runs; use --claim 'A>B')"] + [""] * (len(header) - 1))
    other_orders = ", ".join(o for o in st.orders if o not in st.bench_of)
    incomplete = False
    f = lambda v: "-" if v is None else f"{v:+.{d}f}"  # noqa: E731
    for e in entries:
        res, sign, g = e["res"], e["sign"], e["group"]
        word, why = p_verdict(res.mean, e["holm"], up, alpha)
        if res.n < 2:
            why = f"n={res.n}: a t-test needs at least two units"
        elif res.p is None:
            why = NO_SPREAD_WHY
        if e["confounds"]:  # the rows' runs differ in more than the rows: no paired comparison of the rows
            shown_keys = ", ".join(e["confounds"][:MAX_DIFFERENCES]) + (" ..." if len(e["confounds"]) > MAX_DIFFERENCES else "")
            word, why = "confounded", f"a pair's runs also differ in {shown_keys}"
        ci = "-" if res.lo is None else f"[{res.lo:+.{d}f}, {res.hi:+.{d}f}]"
        shown = f"**{word}**" if word in ("shown", "contradicted") else f"{word} ({why})"
        ties = f" ({sign.ties} tie{'s' if sign.ties > 1 else ''})" if sign.ties else ""
        sign_cell = f"{sign.wins}/{sign.losses}{ties}, p {_fmt_p(sign.p)}" if res.n else "-"
        unrec = f", unrecorded: {e['unrec']}" if e["unrec"] else ""
        hosts = (f"same-host units only: {res.n} of {e['n_all']}" if e["same_only"]
                 else f"cross-host units: {e['cross']}{unrec}")
        n_cell = str(res.n) + (f" ({'(order, seed)' if e['kind'] in ORDER_UNITS else 'seeds'})" if show_kind else "")
        if e["planned"] > e["n_all"]:  # a study still running, or runs that failed: the claim is over those present
            n_cell += f" of {e['planned']} planned †"
            incomplete = True
        if e["left_out"]:
            n_cell += f" ({e['left_out']} seed{'s' if e['left_out'] > 1 else ''} lacking an order left out)"
        if e["unscored"]:
            n_cell += f" (order{'s' if len(e['unscored']) > 1 else ''} {', '.join(e['unscored'])} left out: no learned task)"
        if e["na"]:
            n_cell += f" (order{'s' if len(e['na']) > 1 else ''} {', '.join(e['na'])} left out: {_LABEL[metric]} does not apply)"
        label = f"other (orders {other_orders})" if g == "other" else g
        body.append([f"{e['a']} > {e['b']}", label, n_cell, f(res.mean), ci, _fmt_p(res.p), _fmt_p(e["holm"]), sign_cell, shown, hosts])
        num = lambda v: "" if v is None else round(v, 6)  # noqa: E731
        csv_rows.append([f"{e['a']} > {e['b']}", e["a"], e["b"], g, "order_seed" if e["kind"] in ORDER_UNITS else "seed", res.n, e["n_all"],
                         *(num(v) for v in (res.mean, res.sd, res.lo, res.hi, res.t, res.t_stat, res.p, e["holm"])), e["family"],
                         sign.wins, sign.losses, sign.ties, num(sign.p), word, why, "same_host_only" if e["same_only"] else "all",
                         e["same"], e["cross"], e["unrec"], e["planned"], e["left_out"], ";".join(e["confounds"])])
    left = {o: st.unlearned(o) for o in st.orders}
    left = {o: ts for o, ts in left.items() if ts}
    if left:
        caption += (f" {_LABEL[metric]} in the claims is over the tasks some row learns above their majority-class rate; left out "
                    "(no row above it, the \"Tasks\" table): " + "; ".join(f"order {o}: {', '.join(ts)}" for o, ts in left.items()) + ".")
    kept = {o: [t.task for t in st.task_rates(o) if not t.learned and not t.judged] for o in st.orders}
    kept = {o: ts for o, ts in kept.items() if ts}
    if kept:
        caption += (" Kept in although no run with a majority-class rate learns them above it, since some runs that train them "
                    "have no rate (\"not judged\" in the \"Tasks\" table): " + "; ".join(f"order {o}: {', '.join(ts)}" for o, ts in kept.items()) + ".")
    if why_na:
        caption += (f" {_LABEL[metric]} does not apply to some runs, whose results.json leaves it null by design (not missing): "
                    + "; ".join(NOT_APPLICABLE_WHY[w] for w in sorted(why_na)) + "; a pair with such a run gives no unit, "
                    "and its order is not counted as planned.")
    if incomplete:
        caption += (" † fewer units than the sweep planned (a study still running, or runs that failed): the claim is over "
                    "the units present, which may favour the orders and seeds that finished first.")
    if any(e["group"] == "all" for e in entries) and len(st.benchmarks) > 1:
        caption += (" The \"all\" rows weigh every order alike (a seed unit averages all of its orders), whereas the main "
                    "table's \"All avg\" is the mean of the benchmark averages: the two differ when benchmarks have different "
                    "numbers of orders.")
    if any(e["left_out"] for e in entries):
        caption += (" A seed unit (shared samples, or --unit seed) needs every order of its benchmark group; a seed lacking "
                    "one is left out (its mean would weigh other orders).")
    if any(e["confounds"] for e in entries):
        caption += (" **confounded**: the two runs of some pair differ in config keys other than those their rows are defined "
                    "by (the method preset's keys and the grid keys the row names), so the difference is not the rows'; "
                    "no verdict is drawn (its p-values stay in the table).")
    if absent:
        caption += " Left out: " + "; ".join(f"the sweep plans' claim '{c}': {why}" for c, why in absent) + "."
    caption += _coupled_fast_note(st, list(dict.fromkeys(x for c in claims for x in c)))
    return Table("claims", f"Claims ({_LABEL[metric]}, paired)", caption + "\n\n" + _md(header, body), _csv(csv_rows))


def tasks_table(st: Study) -> Table | None:
    """Per order and task: the majority-class rate of its test set (from runs that recorded
    it), the best row's accuracy right after learning the task (mean over its seeds), and
    whether any row learned it above that rate."""
    header = ["order", "task", "majority class", "best accuracy after learning it", "above the rate", "row", "learned"]
    body, csv_rows = [], [["order", "task", "majority", "majority_min", "majority_max", "best", "margin", "row", "learned",
                           "runs_without_rate"]]
    unjudged: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))  # order -> row -> seeds of runs with no rate
    for order in st.orders:
        for t in st.task_rates(order):
            rate = f"{t.majority:.1f}" + ("" if t.majority_hi - t.majority_lo < 0.05 else f" ({t.majority_lo:.1f}-{t.majority_hi:.1f})")
            f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
            body.append([order, t.task, rate, f(t.best), "-" if t.margin is None else f"{t.margin:+.1f}", t.row or "-",
                         "yes" if t.learned else "**no**" if t.judged else "not judged"])
            num = lambda v: "" if v is None else round(v, 6)  # noqa: E731
            csv_rows.append([order, t.task, num(t.majority), num(t.majority_lo), num(t.majority_hi), num(t.best), num(t.margin),
                             t.row or "", int(t.learned), len(t.unjudged)])
            for row, seed in t.unjudged:
                unjudged[order][row].add(seed)
    if not body:
        return None
    caption = (f"Each task's majority-class rate (the accuracy of always giving its most frequent test label; the mean over the "
               f"order's runs, with their range where independent draws give each run its own test set) beside the best row's "
               f"accuracy right after learning it (mean over seeds) and how far it stands above its own runs' rates (mean over "
               f"seeds of accuracy - rate). A task no row learns more than {LEARNED_MARGIN:g} point above its rate is left out of "
               "the claims, whatever their metric.")
    filled: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for row, order, seed in st.filled:
        if not row.endswith(FAST):
            filled[order][row].add(seed)
    if filled:
        caption += (f" {_count_runs(filled)} run(s) whose results.json predates the rates took them from a run of the same order "
                    "and seed that tested the same rows (equal `provenance` data fingerprints, which cover each task's train "
                    f"and test rows): {_runs_words(filled)}.")
    if unjudged:
        caption += (f" **Not judged**: {_count_runs(unjudged)} run(s) have no rate for tasks they train (a results.json from "
                    "before the rates were recorded, and no run of the same order and seed whose `provenance` fingerprints "
                    f"prove the same test rows): {_runs_words(unjudged)}. Whether they learned a task is unknown, so no task "
                    "they train is left out: one that no run with a rate learns above it is \"not judged\" and stays in the "
                    "claims. `python bench/majority_rates.py <run folder>` recomputes a run's rates from its config.")
    return Table("tasks", "Tasks learned above their majority class", caption + "\n\n" + _md(header, body), _csv(csv_rows))


def _count_runs(runs: dict[str, dict[str, set]]) -> int:
    return sum(len(seeds) for by_row in runs.values() for seeds in by_row.values())


def _runs_words(runs: dict[str, dict[str, set]]) -> str:
    """``order 4: seq_lora (seeds 0, 1, 2), slow_surprise (seed 0)`` for {order: {row: seeds}}."""
    def seeds(ss: set) -> str:
        order = sorted(ss, key=lambda s: (isinstance(s, str), s if isinstance(s, int) else 0, str(s)))
        return f"seed{'s' if len(ss) > 1 else ''} " + ", ".join(str(s) for s in order)

    return "; ".join(f"order {o}: " + ", ".join(f"{row} ({seeds(runs[o][row])})" for row in sorted(runs[o], key=row_sort_key))
                     for o in sorted(runs, key=order_key))


def general_table(st: Study, rows: list[str]) -> Table | None:
    """The general-ability probe (``eval.general``) per row and part: the mean value before the
    stream and after its last task, and the change (after - before) as mean ± sample std over
    runs with n; None when no run was probed."""
    parts: dict[str, str] = {}
    sources = set()
    for rec in st.records.values():
        if rec.general:
            sources.add(str(rec.general["source"]))
            for part, metric in rec.general["metrics"].items():
                parts.setdefault(part, metric)
    if not parts:
        return None
    header = ["method"] + [h for part in parts for h in (f"{part} before", f"{part} after", f"{part} change")]
    body, csv_rows = [], [["row"] + [f"{part}_{s}" for part in parts for s in ("before", "after", "change_mean", "change_std", "n")]]
    for row in rows:
        recs = [rec for (r, _, _), rec in sorted(st.records.items(), key=lambda kv: (order_key(kv[0][1]), str(kv[0][2])))
                if r == row and rec.general]
        if not recs:
            continue
        cells, csv_cells = [], []
        for part in parts:
            before = [rec.general["before"][part] for rec in recs if rec.general["before"].get(part) is not None]
            after = [rec.general["final"][part] for rec in recs if rec.general["final"].get(part) is not None]
            change = [rec.general["change"][part] for rec in recs if rec.general["change"].get(part) is not None]
            sd = stdev(change) if len(change) > 1 else None
            f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
            cells += [f(fmean(before) if before else None), f(fmean(after) if after else None),
                      "-" if not change else f"{fmean(change):+.2f}" + ("" if sd is None else f" ± {sd:.2f}") + f" (n={len(change)})"]
            csv_cells += [round(fmean(before), 6) if before else "", round(fmean(after), 6) if after else "",
                          round(fmean(change), 6) if change else "", "" if sd is None else round(sd, 6), len(change)]
        body.append([row] + cells)
        csv_rows.append([row] + csv_cells)
    if not body:
        return None
    caption = ("What the stream cost the model beyond its tasks: the held-out general-ability probe (`eval.general`; "
               + ", ".join(f"`{s}`" for s in sorted(sources)) + "; never trained on), "
               + ", ".join(f"{part} in {METRIC_NAMES.get(m, m)}" for part, m in parts.items())
               + ", before the stream and after its last task: means over the row's runs; change = after − before, mean ± "
               "sample std over runs (n − 1 denominator; no ± with one run). A perplexity that rose or a score that fell is a loss.")
    return Table("general", "General ability", caption + "\n\n" + _md(header, body), _csv(csv_rows))


def timing_table(st: Study) -> Table:
    """Where the study's time went: per benchmark and host, the runs, the median and range of a
    run's wall time and the total (results.json ``timing.total``). A dual run's fast row is the
    same run and is not counted twice."""
    runs = [rec for (row, _, _), rec in st.records.items() if not row.endswith(FAST)]
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for rec in runs:
        groups[(st.bench_of.get(rec.order, f"order {rec.order}"), rec.host or "(not recorded)")].append(rec)
    bench_rank = {b: i for i, b in enumerate(st.benchmarks)}
    header = ["benchmark", "host", "runs", "timed", "median s", "min-max s", "total h", "thread-h", "CPU h"]
    body, csv_rows = [], [["benchmark", "host", "runs", "timed", "median_s", "min_s", "max_s", "total_s", "thread_s", "cpu_s", "cpu_runs"]]

    def line(bench: str, host: str, recs: list[Record]) -> None:
        secs = sorted(r.seconds for r in recs if r.seconds is not None)
        thread_s = sum(r.seconds * r.threads for r in recs if r.seconds is not None and r.threads is not None)
        untimed_threads = any(r.seconds is not None and r.threads is None for r in recs)
        cpu = [r.cpu_seconds for r in recs if r.cpu_seconds is not None]
        med = median(secs) if secs else None
        f = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
        cpu_text = "-" if not cpu else f"{sum(cpu) / 3600:.2f}" + ("" if len(cpu) == len(recs) else f" ({len(cpu)} runs)")
        body.append([bench, host, str(len(recs)), str(len(secs)), f(med), f"{f(secs[0])}-{f(secs[-1])}" if secs else "-",
                     f"{sum(secs) / 3600:.2f}" if secs else "-",
                     ("-" if untimed_threads or not secs else f"{thread_s / 3600:.2f}"), cpu_text])
        lo, hi = (round(secs[0], 3), round(secs[-1], 3)) if secs else ("", "")
        csv_rows.append([bench, host, len(recs), len(secs), "" if med is None else round(med, 3), lo, hi,
                         round(sum(secs), 3), "" if untimed_threads or not secs else round(thread_s, 3),
                         round(sum(cpu), 3) if cpu else "", len(cpu)])

    for (bench, host), recs in sorted(groups.items(), key=lambda kv: (bench_rank.get(kv[0][0], len(bench_rank)), kv[0][0], kv[0][1])):
        line(bench, host, recs)
    if len(groups) > 1:
        line("all", "all", runs)
    caption = ("Time per run: results.json `timing.total`, the wall seconds of the run after its model is loaded "
               "(training, surprise scoring, evaluation, checkpoints; a resumed run counts what its checkpoints kept). "
               "thread-h = seconds x the run's torch threads (- where a run did not record them). Runs that shared a "
               "machine's cores with another worker took longer than they would alone, and a paused run counts its "
               "pause. CPU h = the runs' process CPU time (results.json `timing.cpu`, all threads of the main "
               "process), which neither a pause nor a neighbour adds to; \"(k runs)\": only k of the runs recorded it "
               "(runs made, or resumed from checkpoints written, before it was recorded do not).")
    return Table("timing", "Wall time", caption + "\n\n" + _md(header, body), _csv(csv_rows))


def missing_table(st: Study, metric: str, rows: list[str]) -> Table:
    miss = st.missing_runs(metric, rows)
    csv_rows = [["row", "order", "seed", "path", "why"]] + [[m.row, m.order, m.seed, m.path, m.why] for m in miss]
    if not miss:
        return Table("missing", "Missing runs", "None: every expected run is present.", _csv(csv_rows))
    planned = any(m.path for m in miss)
    caption = (f"{len(miss)} expected run(s) have no {_LABEL[metric]}; the cells that need them are marked {DAGGER}. "
               + ("Expected runs come from sweep.json plans" + (" and, for runs under no plan, " if not all(m.path for m in miss) else "")
                  if planned else "No sweep.json plan: expected = ")
               + ("every (row x order x seed) combination seen in the runs." if not all(m.path for m in miss) else "."))
    body = [[m.row, m.order, str(m.seed), m.path or "-", m.why] for m in miss]
    return Table("missing", "Missing runs", caption + "\n\n" + _md(["row", "order", "seed", "path", "why"], body), _csv(csv_rows))


def paper_report(paths: list[Path], metric: str = "fp", fast: bool = True, claims: str = "default",
                 custom_claims: list[str] | None = None, order_benchmark: dict[str, str] | None = None,
                 unit: str = "auto") -> PaperReport:
    """Main table, forgetting table, ablation tables (rows with grid values), paired claims and
    missing runs from run directories (see ``surecl report --layout paper``). The claims: the
    paper's whose rows are in the runs (``claims="default"``; ``"none"``: not these), those the
    sweep plans under ``paths`` name (a plan's ``claims`` key) and ``custom_claims``. ``unit``:
    the claims' unit, ``auto`` (from the runs' ``data.draw``) or ``seed``."""
    if unit not in ("auto", "seed"):
        raise SureclError(f"--unit: {unit!r} must be 'auto' or 'seed'")
    if metric not in METRICS:
        raise SureclError(f"--metric: unknown metric {metric!r} (choose from {', '.join(METRICS)})")
    if claims not in ("default", "none"):
        raise SureclError(f"--claims: {claims!r} must be 'default' or 'none'")
    st = Study.load(paths, order_benchmark)
    rep = PaperReport(st, metric, fast)
    pairs = default_claims(st.rows) if claims == "default" else []
    # the study's own claims (its plan's ``claims``, kept in sweep.json; one naming a row that
    # a sweep of some of its methods left unplanned is left out, saying so), then the caller's
    absent = []
    for text in st.plan_claims:
        pair = split_claim(text, "sweep.json: claims:")
        lacking = [name for name in pair if name not in st.rows]
        if lacking:  # a fast row whose row is here: no run of it is dual
            nondual = [n.removesuffix(FAST) for n in lacking if n.endswith(FAST) and n.removesuffix(FAST) in st.rows]
            absent.append((text, f"no run of {', '.join(nondual)} is dual (it has no fast row)" if len(nondual) == len(lacking)
                           else "it names a row no sweep into these folders planned or ran (a sweep of some of the plan's methods)"))
        elif pair not in pairs:
            pairs.append(pair)
    for text in custom_claims or []:
        pair = parse_claim(text, st.rows)
        if pair not in pairs:
            pairs.append(pair)
    rep.claims = pairs
    rows = rep.shown_rows
    rep.tables = [main_table(st, metric, rows), forgetting_table(st, rows), *ablation_tables(st, metric, rows),
                  claims_table(st, metric, pairs, unit=unit, absent=absent), missing_table(st, metric, rows), timing_table(st)]
    general = general_table(st, rows)
    if general is not None:
        rep.tables.insert(rep.tables.index(next(t for t in rep.tables if t.name == "claims")), general)
    tasks = tasks_table(st)
    if tasks is not None:
        rep.tables.insert(rep.tables.index(next(t for t in rep.tables if t.name == "claims")), tasks)
    rep.heatmaps = heatmap_panels(st, [r for r in rows if not parse_row(r)[1]])
    return rep


def heatmap_panels(st: Study, rows: list[str], columns: int = 4) -> list[tuple[str, str, bytes]]:
    """Per order, one figure with a panel per row: its matrix averaged over seeds (rows after
    each task, columns the tasks), the seeds counted in each panel's title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    ran = {(row, order) for row, order, _ in st.records}
    for order in st.orders:
        panels = [(row, m) for row in rows if (m := st.mean_matrix(row, order)) is not None]
        if not panels:
            continue
        drawn = {row for row, _ in panels}
        left_out = [row for row in rows if (row, order) in ran and row not in drawn]
        values = [v for _, (_, mat, _) in panels for line in mat for v in line if v is not None]
        scale = (min(values), max(values)) if values else None
        n_tasks = len(panels[0][1][0])
        cols = min(columns, len(panels))
        rows_n = -(-len(panels) // cols)
        side = max(2.6, 0.45 * n_tasks + 1.6)
        fig, axes = plt.subplots(rows_n, cols, figsize=(side * cols + 0.8, side * rows_n + 0.4), squeeze=False)
        im = None
        for k, (ax, (row, (tasks, mat, n))) in enumerate(zip(axes.flat, panels)):
            im = _draw_matrix(ax, tasks, mat, f"{row} ({n} seed{'s' if n > 1 else ''})", st.kind, labels=False, scale=scale)
            if k % cols:  # the same tasks down every panel of an order: named once, on the left
                ax.set_yticklabels([])
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.colorbar(im, ax=axes.ravel().tolist(), label=_metric_unit(st.kind), shrink=0.8)
        png = _png(fig, dpi=110, bbox_inches="tight")
        caption = (f"Order {order}: each method's {_metric_unit(st.kind)} matrix averaged "
                   "over its seeds (row: after training on that task; column: the task evaluated)."
                   + (f" Not drawn (one-stage runs, or seeds with different task lists): {', '.join(left_out)}." if left_out else ""))
        out.append((order, caption, png))
    # orders are case-sensitive and may hold "+": s1 and S1, a+b and a_b each get their own file
    stems = _stems("heatmap_", [o for o, _, _ in out], [st.orders.index(o) + 1 for o, _, _ in out])
    return [(stems[order], caption, png) for order, caption, png in out]
