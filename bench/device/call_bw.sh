# Device call BW (~150 s with a Triton kit, an H200, needs_h200; sixty-seventh session): the 1M
# headline's set-up alone (32K chunks, every weight kept, PRODUCT_STREAMS as shipped), one
# process's first run without the warm-up prompts, for a budget's last minutes (BH's step, which
# warms up first, may not reach its timed run on a machine whose kit lacks the short prompts'
# kernels). Carry .triton-kit beside .bench, .whl and dsflash/v1.
source bench/device/env.sh
step headline-1m 170 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 80e9 --budget-s 300 --no-warm-up
