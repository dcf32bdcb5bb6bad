"""EWC on the tiny stream (colors -> animals): the accuracy matrix for each penalty strength,
i.e. how much of the first task a lambda keeps and what it costs the second.

Usage: cd bench && python ewc_lambda.py [lambda ...]      (default: 0 1e2 1e4 1e6 1e8)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from surecl.config import build_config
from surecl.errors import SureclError
from surecl.trainer import run

if __name__ == "__main__":
    lambdas = sys.argv[1:] or ["0", "1e2", "1e4", "1e6", "1e8"]
    # the runs and the tiny model's cache are removed when the script ends (on an error or Ctrl-C too)
    with tempfile.TemporaryDirectory(prefix="surecl-ewc-") as folder:
        tmp = Path(folder)
        for lam in lambdas:
            try:
                cfg = build_config("tiny,ewc", ["data.tasks=[colors,animals]", f"ewc.lam={lam}"])
            except SureclError as exc:  # a lambda that is not a number
                sys.exit(f"ewc_lambda.py: {exc}")
            a = run(cfg, tmp / lam, progress=False, cache_dir=tmp / "cache")["accuracy_matrix"]
            print(f"lambda {lam:>5s}: colors after colors {a[0][0]:5.1f}, after animals {a[1][0]:5.1f}; animals {a[1][1]:5.1f}", flush=True)
