# Device call AZ (~170 s, any card; fifty-eighth session): call AY with the prefill warm-up's
# 44-token prompt made 45 (SHORT_WARM_UPS): AY's one miss left was the routers' transposed
# kernel at an odd row count past 8 (the split-K partials' stride unaligned), which the tiny
# checkpoint's routers (8 experts) meet. The GPU worker's tests fail on any
# kernel_compiled_while_serving line.
source bench/device/env.sh
step worker-compiles 200 python3 -m pytest -q -rfE -p no:cacheprovider -n 3 --basetemp "${OUT:-/tmp}/worker-tmp" \
  tests/tiers/test_gpu_worker.py
grep -r "kernel_compiled_while_serving" "${OUT:-/tmp}/worker-tmp" 2>/dev/null \
  | sed -E 's#^.*/([^/]+\.log):.*kernel_compiled#\1 kernel_compiled#' | sort | tee -a "$LOG" "${OUT:-/tmp}/worker-compiles.txt"
grep -rh "prefill_warm_up\|warmed up" "${OUT:-/tmp}/worker-tmp" 2>/dev/null | cut -c1-300 | tee -a "$LOG"
rm -rf "${OUT:-/tmp}/worker-tmp"
