"""Each task's majority-class rate (the accuracy of always giving its most frequent test label)
beside a run's accuracy after learning it and at the end, for runs whose results.json predates
the ``majority`` key (newer runs record it). The test rows are drawn again from the run's own
config, so the benchmark folder it names must be readable from here.

    python bench/majority_rates.py studies/gpu-lnt/seq_lora/order4/seed0 [more run folders]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from surecl.config import config_from_dict
from surecl.data.loading import load_stream
from surecl.run_results import majority_rate


def main(folders: list[str]) -> None:
    for folder in folders:
        res = json.loads((Path(folder) / "results.json").read_text())
        tasks = {t.name: t for t in load_stream(config_from_dict(res["config"]))}
        a = res["accuracy_matrix"]
        print(f"{folder}: FP {res['fp']:.2f}")
        print("| task | majority | after learning it | end |")
        print("|---|---|---|---|")
        for j, name in enumerate(res["tasks"]):
            after = a[j][j] if a[j][j] is not None else a[-1][j]
            print(f"| {name} | {majority_rate(tasks[name]):.1f} | {after:.1f} | {a[-1][j]:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
