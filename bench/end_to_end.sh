#!/usr/bin/env bash
# The default `surecl run` (SmolLM2-135M, embedded benchmark, slow_surprise): wall time and
# peak RSS. Run after one warm-up `surecl run` so the model and data caches exist.
# Usage: bash bench/end_to_end.sh [out] [key=value ...]   (overrides go to `surecl run`)
set -euo pipefail
OUT=${1:-runs/bench-default}
# --fresh: a rerun starts over, removing only what an earlier run wrote in $OUT (never a file of yours)
/usr/bin/time -f "wall %e s, peak RSS %M KiB" surecl run --quiet --fresh --out "$OUT" "${@:2}"
python3 -c "import json,sys; r=json.load(open('$OUT/results.json')); print('FP', round(r['fp'],1), 'AP', round(r['ap'],1), 'timing', r['timing'])"
