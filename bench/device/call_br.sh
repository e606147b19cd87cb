# Device call BR (~330 s on an H100, ~300 on an H200; sixty-fifth session): after call BS, the
# 1M faithful prefill with the products on two CUDA streams (prefill_gemms.PRODUCT_STREAMS)
# against one, alternated in one process, 1 | 2 | 1 | 2, without the warm-up prompts (the first
# run carries the process's compiles: compare the last three). An H100 takes the shipped 16K
# chunks; an H200 the headline's set-up, 32K chunks with every weight kept (which an H100's 80 GB
# cannot hold).
source bench/device/env.sh
step streams-1m 360 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk $CHUNK \
  --weight-cache-bytes $KEEP --budget-s 600 --no-warm-up --prefill-switch "dsflash.model.kernels.prefill_gemms.PRODUCT_STREAMS=1|2|1|2"
