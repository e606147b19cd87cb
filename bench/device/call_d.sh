# Device call D (~470 s): each prefill mHC site in one read of its streams (hc_streams.hc_site,
# SITE_ROWS; built on the CPU in the forty-fourth session, off until timed) and the mixes' dots
# in masked TF32 heads (common.TF32_HEADS; sm_90 SASS: hc_mixes' loop 264 -> 191
# instructions a thread). First their GPU tests (the kernels, and the golden logits with the
# sites on), then a site's launches against one pass at a 16K chunk's rows in a few tiles
# (bench/prefill_passes.py; the mHC is ~75 ms of a 16K chunk in 40 sites: mixes 29, expansions
# 30, collapses 16), then 32K faithful prefills in one process, (SITE_ROWS, TF32_HEADS) off/off,
# off/on, on/on twice over, and last the 1M faithful prefill in 16K chunks with both on (48.87 s
# with both off in the forty-third session, on another machine).
source bench/device/env.sh
step gpu-tests 100 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py -k "site or tf32_heads or hc_ or mixes"
step site-passes 80 python3 bench/prefill_passes.py --rows 16384 --sections mixes,sites --budget-s 75
step sites-32k 105 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.hc_streams.SITE_ROWS=0|0|4096|0|0|4096;dsflash.model.kernels.common.TF32_HEADS=False|True|True|False|True|True" \
  --budget-s 100
step sites-1m 185 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.hc_streams.SITE_ROWS=4096;dsflash.model.kernels.common.TF32_HEADS=True" \
  --budget-s 180
