# Device call O (~450 s, any card): the mHC mixes' dots with the operands as they lie for
# heads (common.RAW_HEADS, fiftieth session; bench/mixes_parts.py measured the loop 724-782 ->
# 532-562 us at 16,384 rows on an H100): the GPU tests of the kernels that take it, the mixes
# and the one-pass sites in each form (bench/prefill_passes.py), then 32K faithful prefills
# alternating the raw heads against Triton's tf32x3, and the one-pass sites (SITE_ROWS, which
# the mixes' dots held back) with them.
source bench/device/env.sh
step gpu-tests 220 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py -k "site or tf32 or hc_ or mixes or fp32 or expand"
step site-passes 120 python3 bench/prefill_passes.py --rows 16384 --sections mixes,sites --budget-s 110
if grep -q "=== gpu-tests rc=0 " "$LOG"; then
step prefill-32k 270 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.common.RAW_HEADS=True|False|True|False|True|True;dsflash.model.kernels.hc_streams.SITE_ROWS=0|0|4096|0|4096|0" \
  --budget-s 900
fi
