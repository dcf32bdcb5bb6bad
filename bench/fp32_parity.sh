#!/usr/bin/env bash
# Fast path vs plain path on a small real run: the same run with the frozen base in bf16
# (surecl's default on CPUs with AVX512-BF16) and in fp32; prints both FPs and the difference.
# Usage: bash bench/fp32_parity.sh [out]
set -euo pipefail
OUT=${1:-runs/parity}
ARGS=(--config surprise --quiet "data.tasks=[newsgroups,tweets]" data.n_train=80 data.n_test=50)
for dtype in bf16 fp32; do
  rm -rf "$OUT/$dtype"
  /usr/bin/time -f "$dtype: wall %e s, peak RSS %M KB" surecl run "${ARGS[@]}" model.dtype=$dtype --out "$OUT/$dtype"
done
python3 - "$OUT" <<'PY'
import json, sys
r = {d: json.load(open(f"{sys.argv[1]}/{d}/results.json")) for d in ("bf16", "fp32")}
for d, x in r.items():
    print(d, "FP", round(x["fp"], 2), "matrix", x["accuracy_matrix"])
print("FP difference bf16 - fp32:", round(r["bf16"]["fp"] - r["fp32"]["fp"], 2), "points")
PY
