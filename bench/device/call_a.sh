# Device call A (~450 s): the 1M faithful prefill with the shipped switches in 16K chunks (since
# the forty-second session: the 1 x 32 rounding inside the encodes, the indexer's FP8 tall tiles,
# the SwiGLU in the down projections' encode, each score slice's top-k beside the next, the
# candidate pool's mask in the score tiles' epilogue), the FP8 tall tiles at both shapes with the
# queries encoded before and in other tiles (why 2,048 queries x 16K entries lose), and the GPU
# tests of the files those changes live in.
source bench/device/env.sh
step defaults-1m 190 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 185
step indexer-fp8 60 python3 bench/h200.py --sections indexer_fp8 --indexer-tiles "64,64,4;128,128,8;64,256,8" \
  --budget-s 55
step gpu-tests 170 python3 -m pytest -q -p no:cacheprovider tests/model/test_fp8_blockwise.py \
  tests/model/test_prefill_gemms.py tests/model/test_indexer.py tests/model/test_kernels.py \
  -k "not test_kernels or candidate_pool or faithful_tall_tiles"
