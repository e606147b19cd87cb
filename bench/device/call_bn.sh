# Device call BN (~450 s, any card; sixty-fourth session): faithful prefill's independent
# FP8 products (the routed experts' runs of rows, wo_a's groups) on several CUDA streams in turn
# (prefill_gemms.PRODUCT_STREAMS, stream_turns.in_turns), so that one product's last, partly
# filled wave of tiles runs beside the next one's first. Its GPU tests (the same bits on 1, 2
# and 3 streams) with the prefill products' others; a 64K faithful prefill in 16K chunks at 1, 2
# and 3 streams alternated in one process; then the 1M at 2 and 1 (the new form first: a
# process's first run is its slowest).
source bench/device/env.sh
step stream-tests 150 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/model/test_fp8_blockwise.py \
  tests/model/test_prefill_gemms.py
step streams-64k 170 python3 bench/decode_ab.py dsflash.model.kernels.prefill_gemms.PRODUCT_STREAMS 1 2 3 \
  --prefill 65536 --chunk 16384 --act-quant --rounds 3 --budget-s 160
step streams-1m 200 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --budget-s 600 --prefill-switch "dsflash.model.kernels.prefill_gemms.PRODUCT_STREAMS=2|1"
