# Device call AR (~330 s, any card; fifty-seventh session): call AQ's tests, which its 150 s
# cut off after four results (the workers' processes compile their kernels and warm their
# CUDA graphs on a fresh machine; and xdist kept the chunk test's printed figures from the log).
# 1. The chunk-on-cuBLAS test alone, its figures printed: every position's largest change
#    against its largest logit (median) and the share of positions whose argmax holds.
# 2. The GPU worker's and the ranks' tests (FastAPI, uvicorn, grpcio-health-checking as wheels).
source bench/device/env.sh
step chunk-test 90 python3 -m pytest -q -s -rfE -p no:cacheprovider \
  "tests/model/test_prefill_gemms.py::test_a_prefill_chunk_on_cublas_gives_the_kernels_logits"
step worker-tests 270 python3 -m pytest -v -rfE -p no:cacheprovider -p bench.device.failures_now -n 4 --timeout 260 \
  --durations 0 tests/tiers/test_gpu_worker.py tests/tiers/test_ranks.py
