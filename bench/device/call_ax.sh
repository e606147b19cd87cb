# Device call AX (~150 s, any card; fifty-eighth session): call AW again, after the prefill
# worker's warm-up took short prompts of 1, 5, 8, 12, 16, 40, 64 and 300 tokens with DSpark taps
# (prefill_worker/engine.SHORT_WARM_UPS), the test's prompt 37 tokens (a length none of them
# has), and each kernel_compiled_while_serving line naming its thread (engine-prefill,
# engine-decode): what still compiles while serving, and in which tier of `dsflash serve`.
source bench/device/env.sh
step worker-compiles 200 python3 -m pytest -q -rfE -p no:cacheprovider -n 3 --basetemp "${OUT:-/tmp}/worker-tmp" \
  tests/tiers/test_gpu_worker.py
worker_compiles_report
