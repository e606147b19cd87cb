# Device call A (~300 s): the 1M faithful prefill with the shipped switches (since the
# forty-second session: the 1 x 32 rounding inside the encodes, the indexer's FP8 tall tiles,
# the SwiGLU in the down projections' encode, each score slice's top-k beside the next) in
# 16K chunks, then in 32K chunks (a 32K chunk spreads the experts' weight encode, ~33 ms, over
# twice the tokens), then the GPU tests of the files those switches live in.
source bench/device/env.sh
step defaults-1m 190 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 185
step defaults-1m-32k-chunks 150 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --budget-s 145
step gpu-tests 150 python3 -m pytest -q -p no:cacheprovider tests/model/test_fp8_blockwise.py \
  tests/model/test_prefill_gemms.py tests/model/test_indexer.py
