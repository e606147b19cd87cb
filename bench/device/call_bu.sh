# Device call BU (~420 s on an H200 with a Triton kit, needs_h200; sixty-seventh session): the
# 1M headline and the newest kernels' GPU tests on an H200, where none has run since the
# fifty-first session. First BR (the 1M in 32K chunks with every weight kept, 1 | 2 | 1 | 2
# streams), then the GPU tests of the files changed since (the Gluon attention's forms, the
# bf16 streams, the query halves, the products on several streams, the top-k, the blockwise
# FP8 products, the compile watch), failures written as they come (failures_now). Carry
# .triton-kit beside .bench, .whl and dsflash/v1. On an H100 it runs the same (BR's 16K form).
source bench/device/call_br.sh
export OMP_NUM_THREADS=2
step gpu-tests-new 170 python3 -m pytest -q -rfE -p no:cacheprovider -p bench.device.failures_now -n 8 --timeout 150 \
  tests/model/test_sparse_attention_gluon.py tests/model/test_bf16_streams.py tests/model/test_query_halves.py \
  tests/model/test_prefill_gemms.py tests/model/test_top_k_kernel.py tests/model/test_fp8_blockwise.py \
  tests/model/test_compile_watch.py
