"""Per task, where a study's FP differences come from: each task's accuracy right after it is
learned and at the end, averaged over a method's finished runs (all orders and seeds).

Usage (from the repository root):
  python bench/study_per_task.py studies/smollm2 slow_surprise slow_reservoir --fast
  python bench/study_per_task.py studies/smollm2 seq_lora mtl --orders lnt8
``--fast`` reads a dual run's fast adapter (``fast`` in results.json: the non-dual method on
the same trajectory) instead of the adapter that answered. A method is a folder under the study
(its grid points, e.g. ``slow_surprise/dual.beta=auto``, are named the same way). ``--orders``
keeps only the runs of those orders (comma-separated; default: every order).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from statistics import fmean


def order_name(folder: str) -> str:
    """The order a run folder's parent names: ``order-s1`` -> ``s1``, ``order4`` -> ``4``."""
    return folder.removeprefix("order-") if folder.startswith("order-") else folder.removeprefix("order")


def per_task(root: Path, method: str, fast: bool, orders: list[str] | None = None) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    final: dict[str, list[float]] = defaultdict(list)
    learned: dict[str, list[float]] = defaultdict(list)
    runs = 0
    # the sweep names an order's folder order-<name> (order-s1) or, for a numbered order and
    # the default one, order<name> (order4, orderdefault)
    for f in sorted((root / method).glob("order*/seed*/results.json")):
        if orders is not None and order_name(f.parent.parent.name) not in orders:
            continue
        r = json.loads(f.read_text())
        src = r.get("fast") if fast else r
        if not src:
            continue
        a, tasks = src["accuracy_matrix"], r["tasks"]
        runs += 1
        for i, t in enumerate(tasks):
            if a[-1][i] is not None:
                final[t].append(a[-1][i])
            if a[i][i] is not None:
                learned[t].append(a[i][i])
    return final, learned, runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", type=Path)
    ap.add_argument("methods", nargs="+")
    ap.add_argument("--fast", action="store_true", help="the fast adapter of dual runs")
    ap.add_argument("--orders", help="comma-separated orders to keep (default: every order)")
    args = ap.parse_args()
    orders = args.orders.split(",") if args.orders else None
    results = {m: per_task(args.study, m, args.fast, orders) for m in args.methods}
    tasks = sorted({t for final, _, _ in results.values() for t in final})
    print("| method | runs | " + " | ".join(f"{t}: learned / end" for t in tasks) + " |")
    print("|---" * (len(tasks) + 2) + "|")
    for m, (final, learned, n) in results.items():
        cells = [f"{fmean(learned[t]):.1f} / {fmean(final[t]):.1f}" if final[t] and learned[t] else "-" for t in tasks]
        print(f"| {m}{' (fast)' if args.fast else ''} | {n} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
