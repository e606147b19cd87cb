# Device call BO (sixty-fourth session): whichever card comes. On an H200, call BG (~360 s: the
# 1M headline in 32K chunks with every weight kept, then the shipped 16K defaults); call BN
# (the products on several streams) then goes to a second call on the warm machine. On any
# other card, call BN (~450 s).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bg.sh
else
  source bench/device/call_bn.sh
fi
