# Device call AY (~170 s, any card; fifty-eighth session): after call AX, the prefill worker
# also warms every route plan variant a batch of up to ONE_PROGRAM_PAIRS pairs compiles
# (fp4_moe.route_plan_warm_up_launches; AX's remaining misses were two plans, 0.15-0.19 s) and
# a 44-token prompt (meant for AX's third miss, a skinny GEMM at 9-16 rows; it missed: that
# one is the routers' at an odd row count, which 45 tokens give). The GPU worker's tests now fail on any
# kernel_compiled_while_serving line; the plan test builds every batch size's plan after the
# warm-up and expects no compile.
source bench/device/env.sh
step plan-tests 60 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py -k "route_plan"
step worker-compiles 200 python3 -m pytest -q -rfE -p no:cacheprovider -n 3 --basetemp "${OUT:-/tmp}/worker-tmp" \
  tests/tiers/test_gpu_worker.py
worker_compiles_report
