# Device call A (~530 s): the 1M faithful prefill with the shipped switches in 16K chunks (since
# the forty-second session: the 1 x 32 rounding inside the encodes, the indexer's FP8 tall tiles,
# the SwiGLU in the down projections' encode, each score slice's top-k beside the next, the
# candidate pool's mask in the score tiles' epilogue); the GPU tests of the files those changes
# live in and of the warm-up's compile threads; the indexer's warm-up on an empty Triton cache,
# its launches on 8 threads, then one after another (54 s in the forty-second session).
source bench/device/env.sh
step defaults-1m 190 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 185
step gpu-tests 170 python3 -m pytest -q -p no:cacheprovider tests/model/test_compile_threads.py \
  tests/model/test_fp8_blockwise.py tests/model/test_prefill_gemms.py tests/model/test_indexer.py \
  tests/model/test_kernels.py -k "not test_kernels or candidate_pool or faithful_tall_tiles or warm_up"
step warm-up-8-threads 70 python3 bench/indexer_warm_up.py --empty-cache --threads 8
step warm-up-1-thread 100 python3 bench/indexer_warm_up.py --empty-cache --threads 1
