# Device call AQ (~420 s, any card; fifty-seventh session).
# 1. Call AO's two failures and two import errors: the chunk-on-cuBLAS test, now over every
#    position's logits (its seed-11 last position flipped in faithful mode on the H100, moved
#    1.9e-3 in exact mode), printing its figures; the GPU worker's and ranks' tests, whose
#    FastAPI, uvicorn and grpcio-health-checking now travel as wheels (prepare.sh).
# 2. The 1M faithful prefill on this card with the rows kernel as shipped since call AP
#    (ROWS_ONCE and PV_IN_FLIGHT on) and off, alternated in one process: the kernel alone took
#    5% off at a 16K chunk, a 256K prefill 0.4% (within its noise).
source bench/device/env.sh
step gpu-tests 150 python3 -m pytest -q -s -rfE -p no:cacheprovider -p bench.device.failures_now -n 4 --timeout 140 \
  tests/tiers/test_gpu_worker.py tests/tiers/test_ranks.py \
  "tests/model/test_prefill_gemms.py::test_a_prefill_chunk_on_cublas_gives_the_kernels_logits"
step rows-1m 260 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --budget-s 600 --prefill-switch "dsflash.model.kernels.sparse_attention_gluon.ROWS_ONCE=True|False;\
dsflash.model.kernels.sparse_attention_gluon.PV_IN_FLIGHT=True|False"
