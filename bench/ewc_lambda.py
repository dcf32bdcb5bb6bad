"""EWC on the tiny stream (colors -> animals): the accuracy matrix for each penalty strength,
i.e. how much of the first task a lambda keeps and what it costs the second.

Usage: cd bench && python ewc_lambda.py [lambda ...]      (default: 0 1e2 1e4 1e6 1e8)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import script

from surecl.config import build_config
from surecl.trainer import run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lambdas", nargs="*", metavar="lambda", help="EWC penalty strengths, ewc.lam (default: 0 1e2 1e4 1e6 1e8)")
    lambdas = ap.parse_args().lambdas or ["0", "1e2", "1e4", "1e6", "1e8"]
    # every lambda's config first: one that is not a number stops the script before any run
    configs = [(lam, build_config("tiny,ewc", ["data.tasks=[colors,animals]", f"ewc.lam={lam}"])) for lam in lambdas]
    # the runs and the tiny model's cache are removed when the script ends (on an error or Ctrl-C too)
    with tempfile.TemporaryDirectory(prefix="surecl-ewc-") as folder:
        tmp = Path(folder)
        for lam, cfg in configs:
            a = run(cfg, tmp / lam, progress=False, cache_dir=tmp / "cache")["accuracy_matrix"]
            print(f"lambda {lam:>5s}: colors after colors {a[0][0]:5.1f}, after animals {a[1][0]:5.1f}; animals {a[1][1]:5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    script(main)
