# Device call AM (~560 s, any card): every test of tests/model on the GPU, each kernel against
# the plain-PyTorch reference path as the CPU suite runs them under the interpreter (issue 9's
# "kernel tests pass ... on the H200"; earlier calls ran the changed files' tests only), with
# the GPU-marked tests of the KV mirror and the GPU worker's ranks. The machine lacks FastAPI,
# so the gateway's tests stay on the CPU suite. Eight workers share the GPU (compiles dominate).
source bench/device/env.sh
step gpu-suite 540 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 --timeout 420 --durations=20 \
  tests/model tests/kvcache/test_mirror.py tests/tiers/test_gpu_worker.py tests/tiers/test_ranks.py
