# Device call BR (~260 s on an H100, ~230 on an H200; sixty-fifth session): after call BN, the
# 1M faithful prefill with the products on STREAMS CUDA streams (prefill_gemms.PRODUCT_STREAMS,
# default 2) against one, alternated in one process, 1 | S | 1 | S (the first run carries the
# process's compiles: compare the last three). An H100 takes the shipped 16K chunks; an H200 the
# headline's set-up, 32K chunks with every weight kept (which an H100's 80 GB cannot hold).
source bench/device/env.sh
S=${STREAMS:-2}
SWITCH="dsflash.model.kernels.prefill_gemms.PRODUCT_STREAMS=1|$S|1|$S"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  step streams-1m 280 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
    --weight-cache-bytes 80e9 --budget-s 600 --prefill-switch "$SWITCH"
else
  step streams-1m 300 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
    --budget-s 600 --prefill-switch "$SWITCH"
fi
