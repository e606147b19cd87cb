# Device call BI (~450 s, any card; sixty-first session): `dsflash serve --act-quant` on the bench
# preset (a random checkpoint drawn on the GPU, 46.5 GiB, one copy of the weights for both
# tiers), every kernel compiled while serving listed: the first server whose prefill takes the
# queries in halves (attention_queries.SPLIT_QUERIES; the GPU worker tests' tiny preset never
# does), with prompts in one chunk and in three, a conversation's next turn and a decode batch
# of three.
source bench/device/env.sh
df -h /tmp | tail -1 | tee -a "$LOG"
step serve-bench 540 python3 bench/serving_compiles.py --make bench /tmp/bench-ckpt --act-quant --log /tmp/serve-bench.log
grep -E "prefill_warm_up|warmed up|serve_ready|Error|error" /tmp/serve-bench.log | cut -c1-400 | tail -20 | tee -a "$LOG"
