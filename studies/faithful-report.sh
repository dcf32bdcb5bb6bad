#!/bin/bash
# The faithful study's two reports (RESULTS.md §9) from its committed results.json files:
# studies/faithful/report ((order, seed) units, the study's own) and
# studies/faithful/report-seed-unit (the seed as the unit, the secondary analysis); the claims
# beside the paper's are the plan's (studies/faithful.yaml `claims`, kept in sweep.json).
# Run from the repository root: bash studies/faithful-report.sh [python]
set -euo pipefail
py=${1:-.venv/bin/python}
OMP_NUM_THREADS=1 "$py" -m surecl.cli report studies/faithful --layout paper --out-dir studies/faithful/report > /dev/null
OMP_NUM_THREADS=1 "$py" -m surecl.cli report studies/faithful --layout paper --unit seed --out-dir studies/faithful/report-seed-unit > /dev/null
