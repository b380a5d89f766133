#!/usr/bin/env bash
# Build the API reference (HTML, from the numpydoc docstrings) with pdoc into OUT (default: a temp folder).
#   bash docs/api/build.sh [OUT]        needs the `docs` (or `test`) extra: pip install -e ".[docs]"
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-$(mktemp -d -t fedsonmf-api-XXXXXX)}"
py="${PYTHON:-.venv/bin/python}"
mapfile -t modules < <(grep -v '^\s*\(#\|$\)' docs/api/modules.txt)
"$py" -W default -m pdoc --docformat numpy --no-show-source -o "$out" "${modules[@]}"
echo "API reference: $out/index.html"
