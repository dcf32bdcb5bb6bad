"""Reports a researcher can paste into a paper: per-run markdown and heatmap, and the
multi-run table (one column per task order, their mean, +- std over seeds, one row per method)."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path
from statistics import fmean, pstdev

from surecl.checkpoint import write_text
from surecl.errors import SureclError


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def matrix_markdown(tasks: list[str], a: list[list[float | None]], initial: list[float] | None = None, digits: int = 1) -> str:
    lines = ["| after \\ on | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    if initial:
        lines.append("| (before training) | " + " | ".join(_fmt(v, digits) for v in initial) + " |")
    for i, row in enumerate(a):
        lines.append(f"| {tasks[i]} | " + " | ".join(_fmt(v, digits) for v in row) + " |")
    return "\n".join(lines)


def heatmap(path: Path, tasks: list[str], a: list[list[float | None]], title: str, metric: str = "accuracy") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = np.array([[np.nan if v is None else v for v in row] for row in a], dtype=float)
    size = max(4.0, 0.55 * len(tasks) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    if metric == "perplexity":  # lower is better: reversed colours, range from the data
        lo, hi = np.nanmin(data), np.nanmax(data)
        im = ax.imshow(data, vmin=lo, vmax=max(hi, lo + 1e-6), cmap="viridis_r")
        dark = lambda v: v > lo + 0.4 * (hi - lo)  # noqa: E731
    else:
        im = ax.imshow(data, vmin=0, vmax=100, cmap="viridis")
        dark = lambda v: v < 60  # noqa: E731
    ax.set_xticks(range(len(tasks)), tasks, rotation=45, ha="right")
    ax.set_yticks(range(len(tasks)), tasks)
    ax.set_xlabel("evaluated on task")
    ax.set_ylabel("after training on task")
    ax.set_title(title)
    for i in range(len(tasks)):
        for j in range(len(tasks)):
            if not np.isnan(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.0f}" if metric != "perplexity" else f"{data[i, j]:.1f}", ha="center", va="center", color="w" if dark(data[i, j]) else "k", fontsize=8)
    fig.colorbar(im, ax=ax, label="perplexity" if metric == "perplexity" else "accuracy (%)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    from surecl.checkpoint import _atomic_write_bytes

    _atomic_write_bytes(path, buf.getvalue())


def write_run_report(out_dir: Path, results: dict) -> None:
    cfg = results["config"]
    name = cfg.get("preset") or cfg["method"]
    metric = results.get("metric", "accuracy")
    ppl = metric == "perplexity"
    digits = 2 if ppl else 1
    lines = [
        f"# surecl run: {name}",
        "",
        f"model `{cfg['model']['name']}`, benchmark `{cfg['data']['benchmark']}`, order `{cfg['data']['order']}`, seed {cfg['seed']}",
        f"method `{cfg['method']}`, replay `{cfg['replay']['policy']}`, dual {'on (beta ' + str(cfg['dual']['beta']) + ')' if cfg['dual']['enabled'] else 'off'}",
        "",
        f"| FP | AP | forgetting ({'FP-AP' if ppl else 'AP-FP'}) | BWT |",
        "|---|---|---|---|",
        f"| {_fmt(results['fp'], digits)} | {_fmt(results['ap'], digits)} | {_fmt(results['forgetting'], digits)} | {_fmt(results['bwt'], digits)} |",
        "",
        "## Perplexity matrix (lower is better)" if ppl else "## Accuracy matrix (%)",
        "",
        matrix_markdown(results["tasks"], results["accuracy_matrix"], results.get("initial"), digits),
        "",
        f"buffer: {results['buffer']['size']} / {results['buffer']['capacity']} {results['buffer']['per_task']}",
        "",
        "timing (s): " + ", ".join(f"{k} {v}" for k, v in results["timing"].items()),
        "",
        "![accuracy matrix](heatmap.png)",
        "",
    ]
    write_text(out_dir / "report.md", "\n".join(lines))
    heatmap(out_dir / "heatmap.png", results["tasks"], results["accuracy_matrix"], f"{name}: FP {_fmt(results['fp'], digits)}", metric)


# --------------------------------------------------------------------------- aggregation


def find_runs(paths: list[Path]) -> list[dict]:
    runs = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise SureclError(f"report: {p} does not exist")
        files = [p] if p.is_file() else sorted(p.rglob("results.json"))
        for f in files:
            try:
                runs.append(json.loads(f.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                raise SureclError(f"report: {f} is not a readable results.json") from None
    if not runs:
        raise SureclError("report: no results.json found under " + ", ".join(map(str, paths)))
    return runs


def aggregate(runs: list[dict], metric: str = "fp") -> tuple[list[str], list[tuple[str, dict[str, tuple[float, float, int]], tuple[float, float]]]]:
    """Rows of (method, {order: (mean, std, n_seeds)}, (mean over orders, std of it))."""
    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    kinds = {r.get("metric", "accuracy") for r in runs}
    if len(kinds) > 1:
        raise SureclError("report: the runs mix accuracy and perplexity streams; report them separately")
    for r in runs:
        if r.get(metric) is None:
            continue
        cfg = r["config"]
        table[cfg.get("preset") or cfg["method"]][str(cfg["data"]["order"])].append(r[metric])
    orders = sorted({o for cells in table.values() for o in cells}, key=lambda o: (not o.isdigit(), o.zfill(3)))
    rows = []
    for method, cells in table.items():
        stats = {o: (fmean(v), pstdev(v), len(v)) for o, v in cells.items()}
        means = [stats[o][0] for o in orders if o in stats]
        rows.append((method, stats, (fmean(means), pstdev(means) if len(means) > 1 else 0.0)))
    return orders, rows


def table_markdown(orders: list[str], rows, metric: str = "fp", unit: str = "accuracy") -> str:
    head = "| method | " + " | ".join(f"Order-{o}" if o.isdigit() else o for o in orders) + " | avg |"
    shown = "perplexity, lower is better" if unit == "perplexity" else "%"
    d = 2 if unit == "perplexity" else 1
    lines = [f"{metric.upper()} ({shown}), mean ± std over seeds", "", head, "|---" * (len(orders) + 2) + "|"]
    for method, stats, (avg, _) in rows:
        cells = [f"{stats[o][0]:.{d}f} ± {stats[o][1]:.{d}f}" if o in stats else "-" for o in orders]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {avg:.{d}f} |")
    return "\n".join(lines) + "\n"


def table_csv(orders: list[str], rows) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["method"] + [f"order_{o}_{s}" for o in orders for s in ("mean", "std", "n")] + ["avg"])
    for method, stats, (avg, _) in rows:
        w.writerow([method] + [x for o in orders for x in (stats[o] if o in stats else ("", "", 0))] + [round(avg, 4)])
    return buf.getvalue()
