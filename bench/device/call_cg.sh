# Device call CG (seventy-first session): whichever card comes. On an H200, call BU (the 1M
# headline in 32K chunks with every weight kept, then the newest kernels' GPU tests; no H200
# has come since the fifty-first session); on any other card, call CE (~200 s: the top-k
# floor's sample in runs, top_k.SAMPLE_RUN). CF (the 1M with runs of 8 against 1) follows CE
# on the warm machine where CE shows runs of 8 winning. The scored prefill's GPU test follows CE
# (on an H200, BV runs it).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bu.sh
else
  source bench/device/call_ce.sh
  # the scored prefill (echo, prompt_logprobs; seventy-second session) on the kernel path
  step gpu-tests-scored 150 python3 -m pytest -q -rfE -p no:cacheprovider --timeout 140 \
    tests/engine/test_prefill_engine.py -k kernel_path
fi
