# Device call BB (~200 s, any card; fifty-eighth session): call AZ with a second turn in the
# GPU worker's test (the prefill worker extends the decode worker's cache of the first turn:
# a chunk that starts past a prefix, which no warm-up prompt does), every compile after the
# warm-ups still failing it.
source bench/device/env.sh
step worker-compiles 240 python3 -m pytest -q -rfE -p no:cacheprovider -n 3 --basetemp "${OUT:-/tmp}/worker-tmp" \
  tests/tiers/test_gpu_worker.py
grep -r "kernel_compiled_while_serving" "${OUT:-/tmp}/worker-tmp" 2>/dev/null \
  | sed -E 's#^.*/([^/]+\.log):.*kernel_compiled#\1 kernel_compiled#' | sort | tee -a "$LOG" "${OUT:-/tmp}/worker-compiles.txt"
grep -rh "prefill_warm_up\|warmed up" "${OUT:-/tmp}/worker-tmp" 2>/dev/null | cut -c1-300 | tee -a "$LOG"
rm -rf "${OUT:-/tmp}/worker-tmp"
