"""Is one source tree slower than another? The same ``surecl run`` with each tree's ``src`` (a
subprocess per run, so nothing is shared), alternated round by round (A B, then B A, ...) so a
drift of the machine's speed reaches both alike; prints each run's wall time and its
``results.json`` timing (train / score / eval seconds), the medians and the ratio B / A, and
whether the two trees' accuracy matrices agree.

    python bench/tree_speed.py OLD_TREE NEW_TREE [--rounds 3] [--out runs/tree_speed] [key=value ...]

The overrides go to both runs (default: the embedded default run cut to its first two tasks).
Measure alone on the machine: another process on the cores changes both trees' figures, not
necessarily alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT = ["data.tasks=[newsgroups,tweets]", "train.batching=uniform", "eval.before=false"]


def one_run(tree: Path, out: Path, overrides: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    cmd = [sys.executable, "-m", "surecl.cli", "run", "--quiet", "--fresh", *overrides, "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=tree)
    wall = time.perf_counter() - start
    res = json.loads((out / "results.json").read_text())
    return {"wall": wall, **{k: res["timing"].get(k, 0.0) for k in ("train", "score", "eval")}, "matrix": res["accuracy_matrix"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/tree_speed"))
    ap.add_argument("overrides", nargs="*", default=DEFAULT)
    args = ap.parse_intermixed_args()
    trees = {"A": args.old.resolve(), "B": args.new.resolve()}
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    print(f"A = {trees['A']}\nB = {trees['B']}\noverrides: {' '.join(args.overrides)}", flush=True)
    for r in range(args.rounds):
        for tag in ("A", "B") if r % 2 == 0 else ("B", "A"):
            res = one_run(trees[tag], args.out.resolve() / f"{tag}-{r}", args.overrides)
            runs[tag].append(res)
            print(f"round {r} {tag}: wall {res['wall']:7.1f} s  train {res['train']:7.1f}  score {res['score']:6.1f}  eval {res['eval']:6.1f}", flush=True)
    print("\n| tree | wall s (median) | train s | score s | eval s |\n|---|---|---|---|---|")
    med = {tag: {k: statistics.median(x[k] for x in runs[tag]) for k in ("wall", "train", "score", "eval")} for tag in runs}
    for tag in runs:
        m = med[tag]
        print(f"| {tag} | {m['wall']:.1f} | {m['train']:.1f} | {m['score']:.1f} | {m['eval']:.1f} |")
    for k in ("wall", "train"):
        print(f"B / A {k}: {med['B'][k] / med['A'][k]:.3f}")
    same = all(x["matrix"] == runs["A"][0]["matrix"] for tag in runs for x in runs[tag])
    print(f"accuracy matrices: {'the same in every run' if same else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
