# Device call BB (~200 s, any card; fifty-eighth session): call AZ with a second turn in the
# GPU worker's test (the prefill worker extends the decode worker's cache of the first turn:
# a chunk that starts past a prefix, which no warm-up prompt does), every compile after the
# warm-ups still failing it.
source bench/device/env.sh
step worker-compiles 240 python3 -m pytest -q -rfE -p no:cacheprovider -n 3 --basetemp "${OUT:-/tmp}/worker-tmp" \
  tests/tiers/test_gpu_worker.py
worker_compiles_report
