# Device call CF (~330 s on an H100 with the kit; seventieth session): after call CE, the 1M
# faithful prefill as call BR sets it up (an H200: 32K chunks with every weight kept; an H100:
# the shipped 16K chunks), no warm-up, with the floor's sample in runs (top_k.SAMPLE_RUN)
# 8 | 1 | 8 | 1 | 8 in one process: run 0 carries the process's compiles, runs 1-4 alternate.
# The same last logits in all five (the floor moves the kept scores, never the ids).
source bench/device/env.sh
step runs-1m 420 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk $CHUNK \
  --weight-cache-bytes $KEEP --budget-s 600 --no-warm-up --prefill-switch "dsflash.model.kernels.top_k.SAMPLE_RUN=8|1|8|1|8"
