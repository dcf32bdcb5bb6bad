"""Run time of the smollm2 study split into the runs issue 13 asks for and the extras.

Asked for: seq_lora, slow_surprise, slow_reservoir and mtl on the Standard CL orders (every
seed), their seed-0 runs on the LNT order, and the one-seed baselines (random, online_surprise,
ewc, per_task, olora, progressive_prompts, nlora, seq_ft) at their plain settings. Extras: every
grid point (levers, the `auto` rule, the balanced rule, bucketed batches, N-LoRA's strength
probe), surprise alone, and LNT seeds beyond 0. Time = results.json ``timing.total`` summed
(single-thread runs: two workers shared each 2-core machine).

Usage (from the repository root): python bench/study_time.py [studies/smollm2]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CLAIMS = {"seq_lora", "slow_surprise", "slow_reservoir", "mtl"}
BASELINES = {"random", "online_surprise", "ewc", "per_task", "olora", "progressive_prompts", "nlora", "seq_ft"}


def asked_for(rel: tuple[str, ...]) -> bool:
    """rel = (method, [grid point,] order-X, seedN, results.json)."""
    if len(rel) != 4:  # a grid point
        return False
    method, order, seed = rel[0], rel[1], rel[2]
    if method in BASELINES:
        return True
    return method in CLAIMS and (order != "order-lnt8" or seed == "seed0")


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "studies/smollm2")
    sums = {True: [0, 0.0], False: [0, 0.0]}
    for f in sorted(root.rglob("results.json")):
        rel = f.relative_to(root).parts
        if rel[0] == "report":
            continue
        t = (json.loads(f.read_text()).get("timing") or {}).get("total")
        if isinstance(t, (int, float)):
            s = sums[asked_for(rel)]
            s[0] += 1
            s[1] += t
    for key, name in ((True, "asked for"), (False, "extras")):
        n, secs = sums[key]
        print(f"{name}: {n} runs, {secs / 3600:.2f} h of single-thread run time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
