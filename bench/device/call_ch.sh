# Device call CH (seventy-third session; kind nvidia-h200 without needs_h200, 600 s): whichever
# card comes. On an H200, call BU (the 1M headline in 32K chunks with every weight kept, now with
# top_k.SAMPLE_RUN = 8, then the newest kernels' GPU tests; no H200 has come since the
# fifty-first session). On an H100, where CE and CF already ran (seventy-second session), the
# shipped 1M once more without a kit (its first run compiles, ~100 s; a second run where the
# budget leaves room), which builds the kit again for the session's later calls, then the scored
# prefill's GPU test.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bu.sh
else
  source bench/device/env.sh
  step shipped-1m 330 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk $CHUNK \
    --weight-cache-bytes $KEEP --budget-s 320 --no-warm-up
  step gpu-tests-scored 150 python3 -m pytest -q -rfE -p no:cacheprovider --timeout 140 \
    tests/engine/test_prefill_engine.py -k kernel_path
fi
