# Device call BK (sixty-second session): whichever card comes. On an H200, call BG (~360 s: the
# 1M headline in 32K chunks with every weight kept, the queries' halves off and on, then the
# shipped 16K defaults). On any other card, call BL (~250 s: call BI at more lengths; this
# call's first run took BI, and a second process found a compile at 3,000 tokens).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bg.sh
else
  source bench/device/call_bl.sh
fi
