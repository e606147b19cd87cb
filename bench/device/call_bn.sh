# Device call BN (~340 s, any card; sixty-fourth session): faithful prefill's independent
# FP8 products (the routed experts' runs of rows, wo_a's groups) on several CUDA streams in turn
# (prefill_gemms.PRODUCT_STREAMS, stream_turns.in_turns), so that one product's last, partly
# filled wave of tiles runs beside the next one's first. Its GPU test (the same bits on 1, 2
# and 3 streams) with two of the routed experts' others; then a 256K faithful prefill in 16K
# chunks at 1, 2 and 3 streams, three rounds alternated in one process (the first warms each
# value's kernels: compare the later two; each run's last logits compare too).
# Sixty-fifth session (H100): the tests passed, but the A/B's prefill warm-up on the fresh
# machine's empty Triton cache outlasted its 240 s step before the first timed run; call BS
# runs the A/B without the warm-up (BO, BP and BQ take this step or its like).
source bench/device/env.sh
step stream-tests 100 python3 -m pytest -q -rfE -p no:cacheprovider -n 2 tests/model/test_fp8_blockwise.py \
  -k "several_streams or swiglu_in_the_encode or experts_under_128"
step streams-256k 240 python3 bench/decode_ab.py dsflash.model.kernels.prefill_gemms.PRODUCT_STREAMS 1 2 3 \
  --prefill 262144 --chunk 16384 --act-quant --rounds 3 --budget-s 230
