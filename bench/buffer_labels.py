"""What a selection rule keeps: per task, how the replay buffer's examples spread over the
task's labels, averaged over a method's finished runs (all orders and seeds).

Reads ``buffer.labels`` of each run's results.json (runs from before that field are skipped).
Per task and method: the runs read, the examples kept, the labels held (mean number of the task's labels with at
least one kept example, of how many), the largest label's share of the task's kept examples,
and the total variation distance of the kept labels from a uniform spread over the task's
labels (0 = every label equally often), beside the mean distance a random pick of the same
number of examples from a balanced task has (simulated: a random buffer is not at 0 either),
and the labels no run kept at all (a random pick misses different labels in different runs; a
rule that misses the same ones never rehearses them). Where a task's count of kept examples
differs between runs (reservoir replay) the examples kept are their mean and range, and the
random pick's distance is the mean over the runs of the distance at each run's count.

Usage (from the repository root):
  python bench/buffer_labels.py studies/smollm2 slow_surprise slow_reservoir random [--seeds 0,1]
A method is a folder under the study (a grid point is named the same way, e.g.
``surprise/train.epochs=2``).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from functools import cache
from pathlib import Path
from statistics import fmean


def spread(counts: dict[str, int]) -> tuple[int, float, float] | None:
    """(labels held, largest share, TV distance from uniform) of one task's kept labels."""
    total = sum(counts.values())
    if not total:
        return None
    k = len(counts)
    shares = [n / total for n in counts.values()]
    return sum(n > 0 for n in counts.values()), max(shares), 0.5 * sum(abs(s - 1 / k) for s in shares)


@cache
def random_tv(k: int, m: int, draws: int = 2000) -> float:
    """Mean TV distance from uniform of m labels drawn at random from k equally frequent ones."""
    rng = random.Random(f"tv:{k}:{m}")
    total = 0.0
    for _ in range(draws):
        counts = [0] * k
        for _ in range(m):
            counts[rng.randrange(k)] += 1
        total += 0.5 * sum(abs(n / m - 1 / k) for n in counts)
    return total / draws


def per_task(root: Path, method: str, seeds: set[str] | None = None):
    """Per task: each run's spread, the number of labels, each run's count of examples kept, and
    the labels every run left out (only the runs of ``seeds`` when given)."""
    rows: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    n_labels: dict[str, int] = {}
    kept: dict[str, list[int]] = defaultdict(list)
    never: dict[str, set[str]] = {}
    # order-<name> (order-s1) or, for a numbered or the default order, order<name> (order4)
    for f in sorted((root / method).glob("order*/seed*/results.json")):
        if seeds is not None and f.parent.name.removeprefix("seed") not in seeds:
            continue
        labels = json.loads(f.read_text()).get("buffer", {}).get("labels")
        for task, counts in (labels or {}).items():
            s = spread(counts)
            if s is not None:
                rows[task].append(s)
                n_labels[task] = len(counts)
                kept[task].append(sum(counts.values()))
                missing = {lab for lab, n in counts.items() if n == 0}
                never[task] = never.get(task, missing) & missing
    return rows, n_labels, kept, never


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", type=Path)
    ap.add_argument("methods", nargs="+")
    ap.add_argument("--seeds", help="comma-separated seeds to read (default: every seed)")
    args = ap.parse_args()
    seeds = None if args.seeds is None else {s.strip() for s in args.seeds.split(",") if s.strip()}
    print("| method | task | runs | kept | labels held | largest share | TV from uniform | a random pick's TV | kept by no run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in args.methods:
        rows, n_labels, kept, never = per_task(args.study, m, seeds)
        if not rows:
            print(f"| {m} | (no run with buffer labels) | 0 | | | | | | |")
        for task in sorted(rows):
            r, k = rows[task], kept[task]
            held = f"{k[0]}" if min(k) == max(k) else f"{fmean(k):.1f} ({min(k)}-{max(k)})"
            pick = fmean(random_tv(n_labels[task], n) for n in k)
            print(f"| {m} | {task} | {len(r)} | {held} | {fmean(x[0] for x in r):.1f} / {n_labels[task]} | "
                  f"{fmean(x[1] for x in r):.2f} | {fmean(x[2] for x in r):.2f} | {pick:.2f} | "
                  f"{', '.join(sorted(never[task])) or '-'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
