"""Each task's majority-class rate (the accuracy of always giving its most frequent test label)
beside a run's accuracy after learning it and at the end, for runs whose results.json predates
the ``majority`` key (newer runs record it). The test rows are drawn again from the run's own
config, so the benchmark folder it names must be readable from here.

    python bench/majority_rates.py studies/gpu-lnt/seq_lora/order4/seed0 [more run folders]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import script

from surecl.config import config_from_dict
from surecl.data.loading import load_stream
from surecl.errors import SureclError
from surecl.run_results import majority_rate

READ = ("config", "tasks", "accuracy_matrix", "fp")  # the keys of results.json this script reads


def read_results(folder: str) -> dict:
    """A run folder's results.json, or one line naming the folder and how to mend it."""
    path = Path(folder) / "results.json"
    try:
        res = json.loads(path.read_text())
    except OSError as exc:
        raise SureclError(f"{path}: cannot read it ({exc.strerror or exc}); give a finished run's folder") from None
    except ValueError as exc:
        raise SureclError(f"{path}: not JSON ({exc}); give a finished run's folder") from None
    missing = [k for k in READ if k not in res] if isinstance(res, dict) else list(READ)
    if missing:
        raise SureclError(f"{path}: no {', '.join(missing)} in it; give a finished run's folder")
    return res


def show(folder: str, res: dict) -> None:
    try:
        tasks = {t.name: t for t in load_stream(config_from_dict(res["config"]))}
    except SureclError as exc:  # e.g. a benchmark folder that is not readable from here
        raise SureclError(f"{folder}: {exc}") from None
    a = res["accuracy_matrix"]
    print(f"{folder}: FP {res['fp']:.2f}")
    print("| task | majority | after learning it | end |")
    print("|---|---|---|---|")
    for j, name in enumerate(res["tasks"]):
        after = a[j][j] if a[j][j] is not None else a[-1][j]
        print(f"| {name} | {majority_rate(tasks[name]):.1f} | {after:.1f} | {a[-1][j]:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", metavar="RUN", help="a run folder (holding its results.json)")
    args = ap.parse_args()
    # every results.json read before the first stream loads: a wrong folder is one line at once
    runs = [(folder, read_results(folder)) for folder in args.folders]
    for folder, res in runs:
        show(folder, res)
    return 0


if __name__ == "__main__":
    script(main)
