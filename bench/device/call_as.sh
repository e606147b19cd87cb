# Device call AS (~300 s, any card; fifty-seventh session): the GPU worker's tests, which call
# AR could not import (FastAPI 0.165 needs opentelemetry-api, now a wheel too): a prefill and a
# decode worker on the GPU over TCP give the in-process model's greedy tokens in both
# precisions, and `dsflash serve` on a GPU runs the kernels. Each worker compiles its kernels
# and warms its CUDA graphs on a fresh machine.
source bench/device/env.sh
step worker-tests 280 python3 -m pytest -v -rfE -p no:cacheprovider -p bench.device.failures_now -n 3 --timeout 270 \
  --durations 0 tests/tiers/test_gpu_worker.py
