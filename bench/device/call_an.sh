# Device call AN (~450 s, any card): call AM again, its two failures named as they come (AM's
# run reached 72% of the suite in its 540 s on eight workers and printed two F's without
# names): sixteen workers, each result on its own line, each failure's report written to
# $OUT/gpu-suite/failures.txt at once (bench/device/failures_now.py).
source bench/device/env.sh
step gpu-suite 430 python3 -m pytest -v -rfE -p no:cacheprovider -p bench.device.failures_now -n 16 --timeout 300 \
  tests/model/test_kernels.py tests/model tests/kvcache/test_mirror.py tests/tiers/test_gpu_worker.py \
  tests/tiers/test_ranks.py
