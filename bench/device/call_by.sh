# Device call BY (sixty-eighth session): whichever card comes. On an H200, call BU (~420 s: the
# 1M headline in 32K chunks with every weight kept, then the newest kernels' GPU tests); on any
# other card, call BX (~270 s: faithful decode experts on FP8 MMAs against the shipped kernels).
# The other one follows on the warm machine where the budget allows.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bu.sh
else
  source bench/device/call_bx.sh
fi
