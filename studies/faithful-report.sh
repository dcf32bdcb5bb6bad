#!/bin/bash
# The faithful study's two reports (RESULTS.md §9) from its committed results.json files:
# studies/faithful/report ((order, seed) units, the study's own) and
# studies/faithful/report-seed-unit (the seed as the unit, the secondary analysis).
# Run from the repository root: bash studies/faithful-report.sh [python]
set -euo pipefail
py=${1:-.venv/bin/python}
claims=(--claim "slow_surprise>slow_reservoir" --claim "slow_surprise>seq_lora" --claim "slow_reservoir>seq_lora"
        --claim "slow_surprise>slow_surprise dual.beta=0.999" --claim "slow_surprise replay.loss=joint>slow_surprise"
        --claim "slow_surprise replay.loss=joint (fast)>slow_surprise (fast)"
        --claim "slow_surprise>slow_surprise train.scheduler=linear"
        --claim "slow_surprise (fast)>slow_surprise train.scheduler=linear (fast)"
        --claim "seq_lora>seq_lora train.scheduler=linear" --claim "mtl>slow_surprise" --claim "mtl>slow_reservoir")
OMP_NUM_THREADS=1 "$py" -m surecl.cli report studies/faithful --layout paper --out-dir studies/faithful/report "${claims[@]}" > /dev/null
OMP_NUM_THREADS=1 "$py" -m surecl.cli report studies/faithful --layout paper --unit seed --out-dir studies/faithful/report-seed-unit "${claims[@]}" > /dev/null
