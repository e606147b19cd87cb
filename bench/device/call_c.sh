# Device call C (~470 s): the score rows padded to a multiple of 16 (indexer.PADDED_ROWS, on
# since the forty-third session, built on the CPU: the top-k's loads 16 bytes wide, not 4; the
# scores' stores likewise): first the GPU tests that take them (the golden logits on the kernel
# path, the padded rows, the warm-up), then the top-k on long rows of an odd length and padded,
# then a 256K faithful prefill with and without (one process, the last logits compare); last,
# the FP8 tall tiles at both shapes (1,150 us a 128 x 1M slice with the queries encoded, 1.33x
# its FP8 floor) at the tile and warp counts not tried yet.
source bench/device/env.sh
step gpu-tests 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py tests/model/test_indexer.py \
  -k "padded or candidate_pool or warm_up or golden or kernel_path or beside"
step top-k-rows 120 python3 bench/top_k_long_rows.py
step padded-rows-256k 130 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --prefill-switch "dsflash.model.layers.indexer.PADDED_ROWS=False|True" --budget-s 125
step indexer-fp8 90 python3 bench/h200.py --sections indexer_fp8 --indexer-tiles "64,128,8;128,64,4;128,64,8;64,64,8" \
  --budget-s 85
