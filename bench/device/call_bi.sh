# Device call BI (~200 s, any card; sixty-first session): `dsflash serve --act-quant` on the bench
# preset's widths at the tiny preset's depth and layer kinds (--shallow: 12 layers, every kind; a
# random checkpoint drawn on the GPU; one copy of the weights for both tiers), every kernel
# compiled while serving listed. Its first run (H100) served the queries in halves and prompts of
# 40 and 45 tokens without a compile, and found 5 compiles (6.4 s) past 300 tokens, in a batch of
# three prompts and in the decode tier's first step at 1,000 tokens; a second process 10 at more
# lengths. The warm-ups now take those (prefill_worker/engine.SHORT_WARM_UPS, BATCHED_WARM_UP;
# decode_worker/warmup.partial_context): rerun it to check that none is left.
source bench/device/env.sh
df -h /tmp | tail -1 | tee -a "$LOG"
# (the script's default lengths: 37 to 9,001 tokens)
step serve-bench 370 python3 bench/serving_compiles.py --make bench /tmp/bench-ckpt --shallow --act-quant \
  --ready-timeout-s 300 --log /tmp/serve-bench.log
grep -E "prefill_warm_up|warmed up|serve_ready|Error|error" /tmp/serve-bench.log | cut -c1-400 | tail -20 | tee -a "$LOG"
pkill -f "dsflash.cli serve" || true  # (a serve the step's limit left behind)
