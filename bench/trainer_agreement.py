"""How far a Trainer script with SureTrainer ends from ``surecl run`` with the same settings,
against how far two seeds of ``surecl run`` end from each other: the numbers behind
tests/test_integration_agreement.py's tolerance.

The setting is tests/trainer_agreement.py's (tiny model, colors/animals/numbers, 32 training
and 24 test examples a task, 8 epochs of batch 8, replay 1:2 into a buffer of 12, EMA 0.9 per
step). Per seed it prints the core's and the Trainer script's final row and FP (mean accuracy
over the tasks after the last), their difference, whether the first task's accuracy after it is the same, whether the buffers hold the same examples,
the EMA (beta, steps, updates) of each, and the Trainer script again with only the order of
the new examples changed (uniform batches of seed + 1000): what the batch order alone moves.
The summary: the sample SD of the core's FP over seeds (seed noise: LoRA init, data draw,
batch order, replay draws), the mean and largest |trainer - core| (same seed: float arithmetic
only), and the mean |other order - same order|.

``--loss pair``: both runs with the paper's pair weighting of replayed rows (``replay.loss=pair``,
``SureArguments.replay_loss="pair"``).

Usage (from the repository root; about 40 s a seed with one thread on 2 busy cores):
  OMP_NUM_THREADS=1 PYTHONPATH=src python bench/trainer_agreement.py --seeds 8 [--loss pair]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import trainer_agreement as ta  # noqa: E402


def members(buffer: dict) -> list[tuple[int, int]]:
    return [(e["task"], e["index"]) for e in buffer["entries"]]


def same_first_row(r: dict) -> bool:
    """The accuracy on the first task after it, the one cell both runs fill in the first row."""
    return round(r["core_matrix"][0][0], 2) == round(r["trainer_matrix"][0][0], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--loss", choices=["joint", "pair"], default="joint", help="replay.loss of both runs")
    parser.add_argument("--cache", type=Path, default=None, help="model cache folder (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cache = args.cache or root / "cache"
        core_fp, diffs, order_diffs = [], [], []
        print("seed | core final row | trainer final row | core FP | trainer FP | diff | other order FP | same first row | same buffer | EMA core / trainer")
        for seed in range(args.seeds):
            r = ta.compare(seed, root, cache, order_seed=seed + 1000, replay_loss=args.loss)
            core_fp.append(r["core_fp"])
            diffs.append(r["trainer_fp"] - r["core_fp"])
            order_diffs.append(r["other_order_fp"] - r["trainer_fp"])
            row = lambda m: [round(x, 1) for x in m[-1]]  # noqa: E731
            print(
                f"{seed} | {row(r['core_matrix'])} | {row(r['trainer_matrix'])} | {r['core_fp']:.2f} | {r['trainer_fp']:.2f} | "
                f"{diffs[-1]:+.2f} | {r['other_order_fp']:.2f} | {same_first_row(r)} | {members(r['core_buffer']) == members(r['trainer_buffer'])} | "
                f"{r['core_ema']} / {r['trainer_ema']}",
                flush=True,
            )
        sd = statistics.stdev(core_fp) if len(core_fp) > 1 else float("nan")
        print(f"core FP over {len(core_fp)} seeds: mean {statistics.mean(core_fp):.2f}, sample SD {sd:.2f}")
        print(f"|trainer - core| FP, same seed: mean {statistics.mean(abs(d) for d in diffs):.2f}, max {max(abs(d) for d in diffs):.2f}")
        print(f"|other order - same order| FP (trainer): mean {statistics.mean(abs(d) for d in order_diffs):.2f}, max {max(abs(d) for d in order_diffs):.2f}")


if __name__ == "__main__":
    main()
