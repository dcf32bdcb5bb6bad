#!/usr/bin/env bash
# Four methods on four real CL_Benchmark tasks (order 1 with yahoo, absent from this copy,
# replaced by SST-2), SmolLM2-135M, 160 train / 80 test examples per task, seed 0.
# Usage: bash bench/cl_benchmark_sweep.sh [path/to/CL_Benchmark] [out]
set -euo pipefail
BENCH=${1:-../shared/benchmarks/CL_Benchmark}
OUT=${2:-runs/cl4}
surecl sweep --methods seq_lora,reservoir,surprise,slow_surprise --orders default --seeds 0 --out "$OUT" --quiet \
  "data.benchmark=$BENCH" "data.tasks=[dbpedia,amazon,SST-2,agnews]" data.n_train=160 data.n_test=80
