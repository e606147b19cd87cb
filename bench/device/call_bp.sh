# Device call BP (sixty-fourth session, with ~460 s of the budget left): whichever card comes.
# On an H200, call BH (~130 s: the shipped 1M alone, the headline's short form), then BN; on any
# other card, BN (~340 s: the prefill products on several streams).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bh.sh
fi
source bench/device/call_bn.sh
