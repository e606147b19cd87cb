# Device call AU (~410 s, any card; fifty-seventh session, after its calls).
# 1. The rows kernel's GPU tests, with only a full query's tile counts staged once
#    (sparse_attention_gluon.STAGED_TILES; the tests stage every count they meet).
# 2. Call AT's first 1M prefill again with the top-k's filter kernel unspecialized on its chunk
#    and pair counts (the 11 variants AT found compiled inside the timed run): every compile
#    logged, none expected after "the timed run begins" (the record's compiles_inside: 0); the
#    first run's time against AT's 47.24 s (45.95 s warmed).
source bench/device/env.sh
step gpu-tests 90 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/model/test_sparse_attention_gluon.py \
  -k "decoded_form or rows_once or operand or compile"
step compiles-1m 170 python3 bench/compile_log.py bench/h200.py --sections prefill --act-quant --prefill 1048576 \
  --chunk 16384 --budget-s 200
awk '/the timed run begins/{f=1} /T1048576: seconds/{f=0} f && /\[compile\]/' "$LOG" | tee -a "${OUT:-/tmp}/in-run.txt" | wc -l
# 3. The GPU worker's tests, their workers' logs kept: each Triton variant a worker compiled
#    after its warm-ups (kernel_compiled_while_serving), what a short prompt or a decode step
#    still waits on.
step worker-compiles 150 python3 -m pytest -q -rfE -p no:cacheprovider -n 3 --basetemp "${OUT:-/tmp}/worker-tmp" \
  tests/tiers/test_gpu_worker.py
grep -rh "kernel_compiled_while_serving" "${OUT:-/tmp}/worker-tmp" 2>/dev/null | sed 's/.*kernel_compiled/kernel_compiled/' \
  | sort | uniq -c | tee -a "$LOG" "${OUT:-/tmp}/worker-compiles.txt"
rm -rf "${OUT:-/tmp}/worker-tmp"
