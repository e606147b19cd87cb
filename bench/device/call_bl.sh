# Device call BL (~250 s, any card; sixty-second session): call BI with more lengths. BK's rerun
# of BI compiled nothing while serving; a second process at other lengths (1 to 20,000 tokens)
# compiled the MoE's gate/up and down at 3,000 tokens (the bench preset's 128-row blocks, from
# 2,048 tokens to 4,095, where cuBLAS takes over: no warm-up length met them). The warm-up now
# adds the shortest prompt of each block height (prefill_worker/engine.expert_block_warm_ups):
# check that, at the lengths of both processes and at the thresholds of the kernels' forms.
# Ran in the sixty-second session (H100, through call BK): no compile while serving at any of them.
source bench/device/env.sh
step serve-bench 450 python3 bench/serving_compiles.py --make bench /tmp/bench-ckpt --shallow --act-quant \
  --ready-timeout-s 300 --log /tmp/serve-bench.log \
  --lengths 37,40,45,300,400,513,700,1000,1025,2000,5000,9001,1,2,33,100,257,520,640,999,1500,3000,7000,12000,16385,20000,130,255,256,1023,1024,2047,2048,2500,4095,4096,4097,8191,8192,8193
grep -E "prefill_warm_up|warmed up|serve_ready|Error|error" /tmp/serve-bench.log | cut -c1-400 | tail -20 | tee -a "$LOG"
pkill -f "dsflash.cli serve" || true  # (a serve the step's limit left behind)
