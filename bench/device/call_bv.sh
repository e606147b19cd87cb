# Device call BV (~200 s, any card; sixty-seventh session): the GPU tests of the files changed
# since the fifty-first session (the Gluon attention's forms, the bf16 streams, the query halves,
# the products on several streams, the top-k, the blockwise FP8 products, the compile watch), 8
# workers, each failure written as it comes (failures_now). Call BU's second half.
source bench/device/env.sh
export OMP_NUM_THREADS=2
step gpu-tests-new 170 python3 -m pytest -q -rfE -p no:cacheprovider -p bench.device.failures_now -n 8 --timeout 150 \
  tests/model/test_sparse_attention_gluon.py tests/model/test_bf16_streams.py tests/model/test_query_halves.py \
  tests/model/test_prefill_gemms.py tests/model/test_top_k_kernel.py tests/model/test_fp8_blockwise.py \
  tests/model/test_compile_watch.py tests/engine/test_prefill_engine.py
