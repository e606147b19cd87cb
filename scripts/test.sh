#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh test
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "warning: redis-server is not installed and cannot be installed here; Redis tests will skip" >&2
  fi
fi
# Triton kernels run on the CPU interpreter when there is no GPU.
.venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
  || export TRITON_INTERPRET=1
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "no tests were collected: failing" >&2
  exit 1
fi
exit "$rc"
