"""How reliably the tiny preset learns one task, per epoch setting: the tests that need a task
learned (``tests/tiny_runs.py``) take their epoch count from this. The tiny model is random and
its training chaotic, so a CPU's kernels alone (fp32 rounding) move a seed's result; a setting
is safe when every seed and task clears 90 % with a margin, not when one seed does.

Usage (from the repository root; ~2 minutes per setting with one thread):
  OMP_NUM_THREADS=1 python bench/tiny_learning.py "train.epochs=12" "train.epochs=16"
Prints, per setting, the lowest accuracy, how many (task, seed) runs stayed below 90 %, and all
of them (tasks colors, animals, numbers x seeds 0-9, seq_lora, each task trained alone).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from surecl import run
from surecl.config import build_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("settings", nargs="+", help="space-separated overrides, one quoted argument per setting")
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for i, setting in enumerate(args.settings):
            acc = []
            for task in ("colors", "animals", "numbers"):
                for seed in range(args.seeds):
                    cfg = build_config("tiny,seq_lora", [f"data.tasks=[{task}]", f"seed={seed}", *setting.split()])
                    # one folder per setting: a run folder holding another config's run is refused
                    out = Path(tmp) / f"setting{i}" / f"{task}-{seed}"
                    acc.append(run(cfg, out, progress=False, cache_dir=cache)["accuracy_matrix"][0][0])
            low = sum(a < 90.0 for a in acc)
            print(f"{setting}: min {min(acc):.1f}, below 90 %: {low} of {len(acc)}; {[round(a) for a in acc]}", flush=True)


if __name__ == "__main__":
    main()
