# Device call P (~400 s, any card): the one-pass mHC sites (hc_streams.SITE_ROWS) with the raw
# heads and tiles by whether a site takes an expand (SITE_TILES, fiftieth session): their GPU
# tests, the sites' passes in more tiles, then 32K faithful prefills alternating SITE_ROWS off
# and on (with DEFER_FFN_EXPAND, a block's FFN output taken in by the next attention site).
source bench/device/env.sh
step gpu-tests 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py -k "site or taken_into or defer"
step site-passes 120 python3 bench/prefill_passes.py --rows 16384 --sections sites --budget-s 110
if grep -q "=== gpu-tests rc=0 " "$LOG"; then
step prefill-32k 270 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.hc_streams.SITE_ROWS=0|4096|0|4096|0|4096" --budget-s 900
fi
