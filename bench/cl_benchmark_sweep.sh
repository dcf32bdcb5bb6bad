#!/usr/bin/env bash
# Four methods on four real CL_Benchmark tasks (order 1 with yahoo, absent from this copy,
# replaced by SST-2), SmolLM2-135M, N_TRAIN train / N_TEST test examples per task, seed 0.
# Usage: bash bench/cl_benchmark_sweep.sh [path/to/CL_Benchmark] [out] [n_train] [n_test]
set -euo pipefail
BENCH=${1:-../shared/benchmarks/CL_Benchmark}
OUT=${2:-runs/cl4}
N_TRAIN=${3:-160}
N_TEST=${4:-80}
surecl sweep --methods seq_lora,reservoir,surprise,slow_surprise --orders default --seeds 0 --out "$OUT" --quiet \
  "data.benchmark=$BENCH" "data.tasks=[dbpedia,amazon,SST-2,agnews]" data.n_train=$N_TRAIN data.n_test=$N_TEST
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).rglob("results.json")):
    r = json.load(open(p))
    print(f"{r['config']['preset']:14s} FP {r['fp']:.1f} AP {r['ap']:.1f} forgetting {r['forgetting']:.1f} BWT {r['bwt']:.1f} "
          f"wall {r['timing']['total']:.0f} s dtype {r.get('base_dtype', r['config']['model']['dtype'])} matrix {r['accuracy_matrix']}")
PY
