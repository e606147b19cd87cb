# Device call I (~300 s, an 80 GB H100): whole-model faithful prefills of the bench preset,
# which fit an H100 since bench/h200.py holds the routed experts stacked once (46.5 GiB of
# weights, ~61.5 GiB at the peak of a 16K chunk). It ran in the forty-seventh session
# (docs/bench/h100-2026-12-05-fortyseventh-call-i.txt): ROPE_IN_ROWS (with ENCODE_IN_ROWS) off
# and on alternated at 32K, and a 256K prefill; its 32K prefills with 10 GB of weights kept
# encoded ran out of memory (14 GiB of the allocator's blocks reserved but unused); with 6 GB
# and the allocator's segments expandable they fit (1.337 -> 1.297 s, -tests-rope-cache.txt).
# Here: that A/B again, then the 1M prefill in 32K chunks (not run yet), if it fits.
source bench/device/env.sh
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
step cache-32k 150 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --weight-cache-bytes 0,6e9,0,6e9 --budget-s 900
step prefill-1m-32k-chunks 200 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --budget-s 900
