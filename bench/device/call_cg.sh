# Device call CG (seventy-first session): whichever card comes. On an H200, call BU (the 1M
# headline in 32K chunks with every weight kept, then the newest kernels' GPU tests; no H200
# has come since the fifty-first session); on any other card, call CE (~200 s: the top-k
# floor's sample in runs, top_k.SAMPLE_RUN). CF (the 1M with runs of 8 against 1) follows CE
# on the warm machine where CE shows runs of 8 winning.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bu.sh
else
  source bench/device/call_ce.sh
fi
