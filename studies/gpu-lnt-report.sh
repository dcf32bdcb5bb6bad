#!/bin/bash
# The GPU study's report (RESULTS.md §9, "On one GPU") from its committed results.json files,
# with issue 26's claims beside the paper's defaults (surprise > reservoir, slow > fast):
# replay against SeqLoRA, surprise against reservoir for the slow adapters, the ablations
# against the main row, and the distance to MTL.
# Run from the repository root: bash studies/gpu-lnt-report.sh [python] [study folder]
set -euo pipefail
py=${1:-.venv/bin/python}
out=${2:-studies/gpu-lnt}
claims=(--claim "slow_surprise>slow_reservoir" --claim "slow_surprise>seq_lora" --claim "slow_reservoir>seq_lora"
        --claim "slow_surprise>slow_surprise dual.beta=0.999" --claim "slow_surprise>slow_surprise dual.unit=step"
        --claim "slow_surprise replay.loss=joint>slow_surprise"
        --claim "mtl>slow_surprise" --claim "mtl>slow_reservoir")
"$py" -m surecl.cli report "$out" --layout paper --out-dir "$out/report" "${claims[@]}"
