#!/usr/bin/env bash
# Create .venv and install dsflash into it (editable). `scripts/install.sh test` adds the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q -U pip
# torch first, pinned: pip takes the CPU build where a local wheel exists, and a loose
# requirement elsewhere would pull a multi-GB CUDA build.
.venv/bin/pip install -q torch==2.13.0
if [ "${1:-}" = "test" ]; then
  .venv/bin/pip install -q -e ".[test]"
else
  .venv/bin/pip install -q -e .
fi
