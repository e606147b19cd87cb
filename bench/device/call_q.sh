# Device call Q (~450 s, an H200: the weights kept need more than an H100's 80 GB): the 1M
# faithful prefill with the mHC mixes' raw heads and the one-pass sites (common.RAW_HEADS,
# hc_streams.SITE_ROWS, fiftieth session) against both off, alternated in one process in the
# best set-up so far (32K chunks, every weight kept: 44.84 s in the forty-ninth session), then
# with the shipped defaults (16K chunks, nothing kept: 46.65 s in the forty-eighth).
source bench/device/env.sh
step kept32k-ab 330 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 80e9 --budget-s 600 \
  --prefill-switch "dsflash.model.kernels.common.RAW_HEADS=True|False;dsflash.model.kernels.hc_streams.SITE_ROWS=4096|0"
step shipped-1m 160 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
