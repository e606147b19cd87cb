# Device call AW (~150 s, any card; fifty-eighth session). Call AU's GPU worker tests found ~40
# Triton variants compiled after the warm-ups (kernel_compiled_while_serving: the MoE's gate/up
# and down, the skinny GEMM in 8 variants, the mHC gates and mix, RoPE, route plan, key
# gathering), 0.06-0.64 s each where the process compiled them itself. Now each line names its
# variant (constants, alignments, constexprs) and the log it came from (prefill-PORT.log,
# decode-PORT.log, serve.log): which shape or form each worker's warm-up missed.
source bench/device/env.sh
step worker-compiles 150 python3 -m pytest -q -rfE -p no:cacheprovider -n 3 --basetemp "${OUT:-/tmp}/worker-tmp" \
  tests/tiers/test_gpu_worker.py
grep -r "kernel_compiled_while_serving" "${OUT:-/tmp}/worker-tmp" 2>/dev/null \
  | sed -E 's#^.*/([^/]+\.log):.*kernel_compiled#\1 kernel_compiled#' | sort | tee -a "$LOG" "${OUT:-/tmp}/worker-compiles.txt"
grep -rh "warm" "${OUT:-/tmp}/worker-tmp" 2>/dev/null | grep -v kernel_compiled | cut -c1-300 | tee -a "$LOG"
rm -rf "${OUT:-/tmp}/worker-tmp"
