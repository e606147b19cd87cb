# Device call D (~570 s): each prefill mHC site in one read of its streams (hc_streams.hc_site,
# SITE_ROWS; built on the CPU in the forty-fourth session, off until timed) and the mixes' dots
# in masked TF32 heads (common.TF32_HEADS; sm_90 SASS: hc_mixes' loop 264 -> 191
# instructions a thread). First their GPU tests (the kernels, and the golden logits with the
# sites on), then a site's launches against one pass at a 16K chunk's rows in a few tiles
# (bench/prefill_passes.py; the mHC is ~75 ms of a 16K chunk in 40 sites: mixes 29, expansions
# 30, collapses 16), then 32K faithful prefills in one process, (SITE_ROWS, TF32_HEADS,
# DEFER_FFN_EXPAND) off/off/off, off/on/off, on/on/off, on/on/on twice over (DEFER_FFN_EXPAND,
# forty-fifth session: a block's FFN output into the next attention site's pass, one read of the
# streams fewer a layer; inert with SITE_ROWS off); 32K prefills with the weights kept re-encoded (0 / 40 GB
# alternated: --weight-cache-bytes, TritonOps.keep_encoded_weights; the routed experts' encode 21
# ms a 16K chunk, the dense weights' ~3-6);
# and last the 1M faithful prefill in 16K chunks with all of them on (48.87 s with all off in the
# forty-third session, on another machine).
source bench/device/env.sh
step gpu-tests 100 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py tests/model/test_fp8_blockwise.py -k "site or tf32_heads or hc_ or mixes or kept_encoded or taken_into"
step site-passes 80 python3 bench/prefill_passes.py --rows 16384 --sections mixes,sites --budget-s 75
step sites-32k 115 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.hc_streams.SITE_ROWS=0|0|4096|4096|0|0|4096|4096;dsflash.model.kernels.common.TF32_HEADS=False|True|True|True|False|True|True|True;dsflash.model.kernels.hc_streams.DEFER_FFN_EXPAND=False|False|False|True|False|False|False|True" \
  --budget-s 110
step experts-kept-32k 90 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --weight-cache-bytes 0,40e9,0,40e9 --budget-s 85
step sites-1m 185 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.hc_streams.SITE_ROWS=4096;dsflash.model.kernels.common.TF32_HEADS=True" \
  --weight-cache-bytes 40e9 --budget-s 180
