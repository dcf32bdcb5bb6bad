#!/usr/bin/env bash
# studies/gpu-lnt.yaml on one GPU: W `surecl sweep` workers share the plan (each run holds a
# lock on its folder, so every worker takes the next free run) and the GPU.
#
#   bash bench/gpu_lnt.sh OUT BENCH [WORKERS] [SECONDS]
#
# OUT: the study folder (studies/gpu-lnt); BENCH: the CL_Benchmark folder; WORKERS: parallel
# workers (default 2: with the plan's unsliced steps each takes up to 30 GB, two used 61 GB of an
# 80 GB H100 together, RESULTS.md §9); SECONDS: stop every worker after this long (0 = no limit): a stopped
# run resumes from its last checkpoint when the same command runs again. The model cache is
# built once before the workers start. Ends with the paper-layout report in OUT/report (with the
# plan's claims, which the sweep keeps in OUT/sweep.json).
set -u
out=${1:?usage: bench/gpu_lnt.sh OUT BENCH [WORKERS] [SECONDS]}
bench=${2:?usage: bench/gpu_lnt.sh OUT BENCH [WORKERS] [SECONDS]}
workers=${3:-2}
limit=${4:-0}
py=${PYTHON:-python3}
mkdir -p "$out"
$py -c "from surecl.data.embedded import default_cache_dir; from surecl.model import smollm2_folder; print(smollm2_folder(default_cache_dir()))" || exit 1
for i in $(seq 1 "$workers"); do
  if [ "$limit" -gt 0 ]; then tl=(timeout -s INT "$limit"); else tl=(); fi
  OMP_NUM_THREADS=1 "${tl[@]}" $py -m surecl.cli sweep --plan studies/gpu-lnt.yaml --out "$out" --quiet \
    "data.benchmark=$bench" > "$out/worker-$i.log" 2>&1 &
  sleep 2
done
wait
$py -m surecl.cli report "$out" --layout paper --out-dir "$out/report" > "$out/report.txt" 2>&1
tail -n 3 "$out"/worker-*.log
