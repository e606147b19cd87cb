# Device call BQ (~280 s, any card; sixty-fourth session, with ~370 s of the budget left): call
# BN's A/B first and lighter, then its GPU test. A 256K faithful prefill in 16K chunks at 1 and 2
# streams (prefill_gemms.PRODUCT_STREAMS), three rounds alternated in one process (the first
# warms each value's kernels: compare the later two; the last logits compare too); then the
# streams' GPU test alone. (Its 220 s A/B step is too short for the warm-up on an empty Triton
# cache, as BN's was in the sixty-fifth session: take call BS.)
source bench/device/env.sh
step streams-256k 220 python3 bench/decode_ab.py dsflash.model.kernels.prefill_gemms.PRODUCT_STREAMS 1 2 \
  --prefill 262144 --chunk 16384 --act-quant --rounds 3 --budget-s 210
step stream-test 80 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_fp8_blockwise.py -k several_streams
