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
# Triton kernels run on the CPU interpreter when there is no GPU. The interpreter is
# single-threaded Python, so there the suite runs in one process per core, each with one torch
# thread (2-core CI: 1,077 s in one process, 504 s in two; two processes of two threads each
# fought over the cores and took 1,068 s). GPU tests share one device: one process there.
# DSFLASH_TEST_WORKERS overrides the count.
workers=1
if ! .venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  export TRITON_INTERPRET=1
  workers=$(nproc)
  [ "$workers" -gt 4 ] && workers=4
fi
workers=${DSFLASH_TEST_WORKERS:-$workers}
parallel=()
if [ "$workers" -gt 1 ]; then
  export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
  parallel=(-n "$workers" --dist worksteal)
fi
set +e
.venv/bin/python -m pytest -q "${parallel[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "no tests were collected: failing" >&2
  exit 1
fi
exit "$rc"
