# Device call C (~200 s): the 32K faithful prefill with the shipped defaults (the table's 1.253 s
# ran with EXPAND_MIX_ROWS at prefill rows and without TOP_K_BESIDE), then the FP8 tall tiles at
# both shapes (1,150 us a 128 x 1M slice with the queries encoded, 1.33x its FP8 floor, in the
# forty-third session) at the tile and warp counts not tried yet.
source bench/device/env.sh
step defaults-32k 100 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 --budget-s 95
step indexer-fp8 90 python3 bench/h200.py --sections indexer_fp8 --indexer-tiles "64,128,8;128,64,4;128,64,8;64,64,8" \
  --budget-s 85
