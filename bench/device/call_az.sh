# Device call AZ (~170 s, any card; fifty-eighth session): call AY with the prefill warm-up's
# 44-token prompt made 45 (SHORT_WARM_UPS): AY's one miss left was the routers' transposed
# kernel at an odd row count past 8 (the split-K partials' stride unaligned), which the tiny
# checkpoint's routers (8 experts) meet. The GPU worker's tests fail on any
# kernel_compiled_while_serving line.
source bench/device/env.sh
step worker-compiles 200 python3 -m pytest -q -rfE -p no:cacheprovider -n 3 --basetemp "${OUT:-/tmp}/worker-tmp" \
  tests/tiers/test_gpu_worker.py
worker_compiles_report
