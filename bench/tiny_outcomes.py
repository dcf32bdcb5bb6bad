"""What the tiny-model outcome tests assert, measured per seed: the distributions their
thresholds must hold over, on this machine's kernels.

The tiny model is random and its training chaotic: a CPU's fp32 kernels alone move a seed's
result (a task that one processor learns to 100 % another leaves at 25 %). A test threshold is
safe when it holds with a margin over many seeds here and on the figures measured on other
processors, not when it holds for the three seeds a test runs.

Usage (from the repository root; about 12 minutes with one thread at seeds 0-5):
  OMP_NUM_THREADS=1 python bench/tiny_outcomes.py --seeds 6 [key=value ...]
Prints, per quantity, every seed's value and the mean of the tests' seeds 0-2 and of all:
  retention/<preset>: mean accuracy on the two earlier tasks after the third (greedy), the
      quantity of tests/test_end_to_end.py::test_replay_keeps_more_of_earlier_tasks_than_seq_lora
  rank_retention/<preset>: the same scored by label ranking (tests/test_olora_runs.py)
  second_task/seq_lora: seq_lora on [colors, animals] with 16 test examples: the first task right
      after it, the first task after the second, and the second (tests/test_plugins.py's
      registered-method test)
  mtl: the final row of MTL over three tasks (tests/test_method_outcomes.py)
  orth_overlap/<lambda>: O-LoRA's last A against the earlier tasks' at the end of a small run,
      with the orthogonality penalty (0.5) and without (0), and their ratio
      (tests/test_olora_runs.py's penalty test)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tiny_runs import LEARNED, orth_overlap  # noqa: E402

from surecl import run  # noqa: E402
from surecl.config import build_config  # noqa: E402

THREE = "data.tasks=[colors,animals,numbers]"


def _matrix(preset: str, overrides: list[str], out: Path, cache: Path) -> list[list[float]]:
    return run(build_config(f"tiny,{preset}", overrides), out, progress=False, cache_dir=cache)["accuracy_matrix"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--only", default="", help="comma-separated quantity prefixes to measure (default: all)")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run (after the tests' own)")
    args = ap.parse_args()
    only = [p for p in args.only.split(",") if p]
    seeds = range(args.seeds)

    def wanted(name: str) -> bool:
        return not only or any(name.startswith(p) for p in only)

    results: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for seed in seeds:
            extra = [f"seed={seed}", *args.overrides]
            for preset in ("seq_lora", "surprise", "reservoir"):
                if wanted(f"retention/{preset}"):
                    a = _matrix(preset, [THREE, LEARNED, *extra], Path(tmp) / f"g-{preset}-{seed}", cache)
                    results.setdefault(f"retention/{preset}", []).append(sum(a[-1][:-1]) / 2)
            for preset in ("seq_lora", "olora"):
                if wanted(f"rank_retention/{preset}"):
                    form = ["olora.orth_norm=fro2", "olora.l2_norm=fro2"]  # the penalty form these figures were measured in
                    a = _matrix(preset, [THREE, "eval.mode=rank", LEARNED, *form, *extra], Path(tmp) / f"r-{preset}-{seed}", cache)
                    results.setdefault(f"rank_retention/{preset}", []).append(sum(a[-1][:-1]) / 2)
            if wanted("second_task"):
                a = _matrix("seq_lora", ["data.tasks=[colors,animals]", "data.n_test=16", LEARNED, *extra], Path(tmp) / f"s-{seed}", cache)
                results.setdefault("second_task/seq_lora", []).append((a[0][0], a[1][0], a[1][1]))
            if wanted("orth_overlap"):
                for lam in ("0.5", "0"):
                    value = orth_overlap(Path(tmp) / f"o-{lam}-{seed}", cache, [f"olora.lambda_orth={lam}", "olora.orth_norm=fro2", "olora.l2_norm=fro2", *extra])
                    results.setdefault(f"orth_overlap/{lam}", []).append(value)
                results.setdefault("orth_overlap/ratio", []).append(results["orth_overlap/0.5"][-1] / results["orth_overlap/0"][-1])
            if wanted("mtl"):
                a = _matrix("mtl", [THREE, *extra], Path(tmp) / f"m-{seed}", cache)
                results.setdefault("mtl", []).append(tuple(a[-1]))
            print(f"seed {seed} done", flush=True)
    for name, values in results.items():
        if isinstance(values[0], tuple):
            print(f"{name}: {[tuple(round(v, 1) for v in row) for row in values]}")
            continue
        first = values[:3]
        print(f"{name}: {[round(v, 2) for v in values]}; mean seeds 0-2 {sum(first) / len(first):.2f}, "
              f"all {sum(values) / len(values):.2f}, max {max(values):.2f}, min {min(values):.2f}")


if __name__ == "__main__":
    main()
