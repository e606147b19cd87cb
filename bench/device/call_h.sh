# Device call H (~520 s, H200), for a session that can start one machine only. It times what
# an H100 cannot: the headline 1M prefill on the target card, and 40 GB of kept weights beside
# the bench preset's prefill (10 GB did not fit an H100's 80 GB in the forty-seventh session).
# The forty-sixth session ran every GPU test of the untimed forms on an H100 (75 passed) and
# timed their kernels there: the queries' RoPE inside the Gluon rows kernel and the top-k's
# PTX filter won and are on; the one-pass sites and the keep in the score tiles lost and are off.
# - the rows kernel with and without its RoPE at an H200's bandwidth (bench/rope_in_rows.py);
# - 32K faithful prefills with the weights kept encoded (--weight-cache-bytes) off and on,
#   alternated;
# - the 1M prefill with the shipped switches (since the forty-seventh session ENCODE_IN_ROWS too:
#   51.98 -> 51.06 s on an H100): first plain, for the headline against the forty-third
#   session's 48.87 s, then with 40 GB of weights kept encoded.
# `bash bench/device/call_h.sh 1m` (~380 s) runs the two 1M prefills alone.
source bench/device/env.sh
if [ "${1:-}" != 1m ]; then
step rope-in-rows 40 python3 bench/rope_in_rows.py
step cache-32k 100 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --weight-cache-bytes 0,40e9,0,40e9 --budget-s 900
fi
step plain-1m 185 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 180
# (40 GB of weights kept beside the 1M prefill do not fit an H100's 80 GB)
if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ]; then
step cache-1m 185 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --weight-cache-bytes 40e9 --budget-s 180
fi
