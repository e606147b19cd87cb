# Device call C (~440 s): the 1M faithful prefill in 32K chunks (a 32K chunk spreads the
# experts' weight encode, ~33 ms, over twice the tokens), then in 16K chunks with its last chunk
# profiled (where a late chunk's ~1 s goes with the shipped switches; the twentieth session's
# profile is the latest); the FP8 tall tiles at both shapes with the queries encoded before and
# in other tiles (why 2,048 queries x 16K entries lose).
source bench/device/env.sh
step defaults-1m-32k-chunks 170 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --budget-s 165
step profile-1m-last-chunk 200 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --budget-s 195 --profile
step indexer-fp8 60 python3 bench/h200.py --sections indexer_fp8 --indexer-tiles "64,64,4;128,128,8;64,256,8" \
  --budget-s 55
