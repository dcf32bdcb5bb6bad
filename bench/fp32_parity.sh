#!/usr/bin/env bash
# Fast path vs plain path on a small real run, over several seeds, on the whole test splits
# (about 200 examples per task, so one answer moves a task's accuracy by 0.5 points); prints
# every FP, the per-seed differences and the mean difference. Two comparisons:
#   dtype  (default): the frozen base in bf16 (surecl's default on CPUs with AVX512-BF16) vs fp32;
#           where the device has no native bf16 matmuls, the bf16 side runs them through
#           bench/bf16_emulation.py (bf16 operands, fp32 products and sums, bf16 results);
#   prefix: the shared prompt prefix run once per batch (model.share_prefix=true, the default)
#           vs every row run whole (false), both with the base in fp32.
# Usage: bash bench/fp32_parity.sh [out] [seeds] [dtype|prefix]   (default: runs/parity "0 1 2" dtype)
set -euo pipefail
OUT=${1:-runs/parity}
SEEDS=${2:-0 1 2}
MODE=${3:-dtype}
ARGS=(--config surprise --quiet "data.tasks=[newsgroups,tweets]" data.n_train=80 data.n_test=0)
case "$MODE" in
  dtype) FAST=bf16; PLAIN=fp32; fast=(model.dtype=bf16); plain=(model.dtype=fp32) ;;
  prefix) FAST=shared; PLAIN=whole; fast=(model.dtype=fp32 model.share_prefix=true); plain=(model.dtype=fp32 model.share_prefix=false) ;;
  *) echo "mode must be dtype or prefix" >&2; exit 2 ;;
esac
BF16_RUN=(surecl run)
if [ "$MODE" = dtype ]; then
  # the device surecl trains on (CUDA if there is one) decides; a failure here stops the script
  native=$(python -c 'import torch; from surecl.model import bf16_supported; print(int(bf16_supported(torch.device("cuda" if torch.cuda.is_available() else "cpu"))))')
  if [ "$native" = 0 ]; then
    echo "no native bf16 matmuls on this device: the bf16 runs emulate them (bench/bf16_emulation.py)"
    BF16_RUN=(python "$(dirname "$0")/bf16_emulation.py" run)
  fi
fi
for seed in $SEEDS; do
  for side in fast plain; do
    if [ $side = fast ]; then name=$FAST; over=("${fast[@]}"); cmd=("${BF16_RUN[@]}"); else name=$PLAIN; over=("${plain[@]}"); cmd=(surecl run); fi
    # --fresh: start over, removing only what an earlier run wrote there (never a file of yours)
    /usr/bin/time -f "$name seed $seed: wall %e s, peak RSS %M KiB" "${cmd[@]}" "${ARGS[@]}" seed=$seed "${over[@]}" --fresh --out "$OUT/$name-$seed"
  done
done
python - "$OUT" "$FAST" "$PLAIN" $SEEDS <<'PY'
import json, sys
out, fast, plain, seeds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
diffs = []
for s in seeds:
    r = {d: json.load(open(f"{out}/{d}-{s}/results.json")) for d in (fast, plain)}
    diffs.append(r[fast]["fp"] - r[plain]["fp"])
    for d, x in r.items():
        print(f"seed {s} {d}: FP {x['fp']:.2f} matrix {x['accuracy_matrix']} timing {x['timing']}")
print(f"FP difference {fast} - {plain} per seed:", [round(d, 2) for d in diffs])
print(f"mean FP difference: {sum(diffs) / len(diffs):+.2f} points, mean |difference| {sum(map(abs, diffs)) / len(diffs):.2f}")
PY
