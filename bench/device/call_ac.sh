# Device call AC (~350 s, an H200: the weights kept need more than an H100's 80 GB; needs_h200):
# the 1M faithful prefill with the fifty-second session's three prefill switches on (the shared
# expert's operand shared with the routed experts, the mHC sites writing their input's operand,
# the attention site's unread fp32 input left out) against all three off, alternated in one
# process in the best set-up so far (32K chunks, every weight kept: 42.19 s in the fifty-first
# session's call W; on an H100 the switches took 0.7 s off the shipped 1M, fifty-third session).
# Then 48K chunks with every weight kept (32K -> 64K chunks saved ~1.9 s with nothing kept,
# fiftieth session; 64K and the weights do not fit 141 GB) and the shipped defaults (16K chunks,
# nothing kept: 44.28 s). (The Gluon score tiles are left out: slower, fifty-third session's AE.)
source bench/device/env.sh
step kept32k-ab 220 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 80e9 --budget-s 400 --prefill-switch "$THREE_SWITCHES"
step kept48k 110 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 49152 \
  --weight-cache-bytes 80e9 --budget-s 200
step shipped-1m 130 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
