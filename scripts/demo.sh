#!/usr/bin/env bash
# Main job on a fresh machine: set up, then run the synthetic demo (h = 0.6, with and
# without drift correction); writes results/demo-*.json and results/demo-*.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p -m 700 results  # our outputs are private (0600 files, docs/privacy.md)
.venv/bin/fedsonmf synthetic --heterogeneity 0.6 --rounds 30 --seed 0 \
  --json results/demo-correction.json --plot results/demo-correction.png
.venv/bin/fedsonmf synthetic --heterogeneity 0.6 --rounds 30 --seed 0 --no-correction \
  --json results/demo-no-correction.json --plot results/demo-no-correction.png
.venv/bin/fedsonmf plot results/demo-correction.json results/demo-no-correction.json \
  --title "synthetic demo: 10 clients, h = 0.6, tau = 10" --out results/demo-both.png
