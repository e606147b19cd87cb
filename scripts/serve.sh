#!/usr/bin/env bash
# Install dsflash into .venv and run `dsflash serve` (extra arguments are passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
exec .venv/bin/dsflash serve "$@"
