# Device call BY (sixty-eighth session): whichever card comes. On an H200, call BU (~420 s: the
# 1M headline in 32K chunks with every weight kept, then the newest kernels' GPU tests); on any
# other card, call BZ (~90 s: the decode experts spike's f16 dots; BX, its FP8 dots, ran on an
# H100 in the sixty-eighth session). The other one follows on the warm machine where the budget
# allows.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bu.sh
else
  source bench/device/call_bz.sh
fi
