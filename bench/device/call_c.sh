# Device call C (~530 s): the score rows padded to a multiple of 16 (indexer.PADDED_ROWS, on
# since the forty-third session, built on the CPU: the top-k's loads 16 bytes wide, not 4; the
# scores' stores likewise): first the GPU tests that take them (the golden logits on the kernel
# path, the padded rows, the warm-up), then the top-k on long rows of an odd length and padded,
# then decode steps at a 1M context with and without, alternated in one process (a chunked
# prefill's rows are multiples of 8,192 entries at every 16K chunk, so the 1M prefill never had
# odd rows; a decode step's are odd every other token, as is a prompt's last chunk; a synthetic
# request's context must be even here, whose ratio-1 layers' rows of 1,048,574 entries are not
# a multiple of 16; on the tiny preset in the interpreter the two gave the same tokens); last, the
# FP8 tall tiles at both shapes (1,150 us a 128 x 1M slice with the queries encoded, 1.33x its
# FP8 floor) at the tile and warp counts not tried yet.
source bench/device/env.sh
step gpu-tests 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py tests/model/test_indexer.py \
  -k "padded or candidate_pool or warm_up or golden or kernel_path or beside"
step top-k-rows 120 python3 bench/top_k_long_rows.py
step padded-rows-decode-1m 200 python3 bench/decode_ab.py dsflash.model.layers.indexer.PADDED_ROWS False True \
  --context 1048574 --batches 1,8 --rounds 2 --budget-s 190
step indexer-fp8 90 python3 bench/h200.py --sections indexer_fp8 --indexer-tiles "64,128,8;128,64,4;128,64,8;64,64,8" \
  --budget-s 85
