# Device call BM (sixty-third session): whichever card comes. On an H200, call BG (~360 s: the
# 1M headline in 32K chunks with every weight kept, the queries' halves off and on, then the
# shipped 16K defaults). On any other card, call BJ (139 s on an H100: the decode A/B of the
# transposed GEMM's row count, specialized or not), which an H100's 80 GB now holds:
# bench/h200.py holds the routed experts once, stacked, as a worker does (hold_experts_once;
# call V had run out of memory with both forms held).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bg.sh
else
  DECODE_S=140
  source bench/device/call_bj.sh
fi
