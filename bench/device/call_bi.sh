# Device call BI (~350 s, any card; sixty-first session): `dsflash serve --act-quant` on the bench
# preset's widths at the tiny preset's depth and layer kinds (--shallow: 12 layers, every kind; a
# random checkpoint drawn on the GPU; one copy of the weights for both tiers), every kernel
# compiled while serving listed. The first server whose prefill takes the queries in halves
# (attention_queries.SPLIT_QUERIES; the GPU worker tests' tiny preset never does), with prompts
# in one chunk and in three, a conversation's next turn and a decode batch of three; and prompts
# of 40 and 45 tokens, which the warm-up no longer takes (fp8_gemm's row count unspecialized).
source bench/device/env.sh
df -h /tmp | tail -1 | tee -a "$LOG"
step serve-bench 370 python3 bench/serving_compiles.py --make bench /tmp/bench-ckpt --shallow --act-quant \
  --lengths 37,40,45,1000,9001 --ready-timeout-s 300 --log /tmp/serve-bench.log
grep -E "prefill_warm_up|warmed up|serve_ready|Error|error" /tmp/serve-bench.log | cut -c1-400 | tail -20 | tee -a "$LOG"
pkill -f "dsflash.cli serve" || true  # (a serve the step's limit left behind)
