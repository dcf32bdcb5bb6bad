#!/usr/bin/env bash
# Fast path vs plain path on a small real run: the same runs with the frozen base in bf16
# (surecl's default on CPUs with AVX512-BF16) and in fp32, over several seeds, on the whole
# test splits (about 200 examples per task, so one answer moves a task's accuracy by 0.5
# points); prints every FP, the per-seed differences and the mean difference.
# Usage: bash bench/fp32_parity.sh [out] [seeds]      (default: runs/parity "0 1 2")
set -euo pipefail
OUT=${1:-runs/parity}
SEEDS=${2:-0 1 2}
ARGS=(--config surprise --quiet "data.tasks=[newsgroups,tweets]" data.n_train=80 data.n_test=0)
for seed in $SEEDS; do
  for dtype in bf16 fp32; do
    rm -rf "$OUT/$dtype-$seed"
    /usr/bin/time -f "$dtype seed $seed: wall %e s, peak RSS %M KB" surecl run "${ARGS[@]}" seed=$seed model.dtype=$dtype --out "$OUT/$dtype-$seed"
  done
done
python3 - "$OUT" $SEEDS <<'PY'
import json, sys
out, seeds = sys.argv[1], sys.argv[2:]
diffs = []
for s in seeds:
    r = {d: json.load(open(f"{out}/{d}-{s}/results.json")) for d in ("bf16", "fp32")}
    diffs.append(r["bf16"]["fp"] - r["fp32"]["fp"])
    for d, x in r.items():
        print(f"seed {s} {d}: FP {x['fp']:.2f} matrix {x['accuracy_matrix']} timing {x['timing']}")
print("FP difference bf16 - fp32 per seed:", [round(d, 2) for d in diffs])
print(f"mean FP difference: {sum(diffs) / len(diffs):+.2f} points, mean |difference| {sum(map(abs, diffs)) / len(diffs):.2f}")
PY
