#!/usr/bin/env bash
# Set up (venv + test extras, incl. Flower) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
exec .venv/bin/python -m pytest "$@"
