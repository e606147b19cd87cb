# Device call M (~250 s, any card): a prefill chunk's index top-k filtered from 32 k scores a
# row in launches of many rows (top_k.PREFILL_FILTER_ROWS, forty-ninth session), against the
# radix select over every score below 128 k (1,000,000,000: no launch has that many rows). A
# 256K faithful prefill in 16K chunks: its chunks past 64K tokens take rows of 16K to 64K
# entries, where the filtered form took 749-2,168 us a slice against 3,231-3,519 (H100,
# bench/top_k_long_rows.py --shapes). Alternated in one process; the last logits must agree.
source bench/device/env.sh
step prefill-256k 330 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.top_k.PREFILL_FILTER_ROWS=1024|1000000000|1024|1000000000" --budget-s 600
