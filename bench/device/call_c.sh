# Device call C (~550 s): the forty-first session's changes at 32K in one process (faithful mode's
# 1 x 32 rounding inside the products' operand encode with the encode in 32-row tiles, and each
# mHC site's streams read once: off / encodes / off / one pass / both), a site's passes apart
# and in one (bench/prefill_passes.py), the indexer's FP8 tall tiles against the bf16 ones at
# 128 queries x 1M entries (with the sums promoted to fp32 too), and the 1M faithful prefill in
# 32K chunks with every switch on (a 32K chunk spreads the experts' weight encode, ~33 ms, over
# twice the tokens).
source bench/device/env.sh
M=dsflash.model.kernels
step changes-32k 170 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --budget-s 160 --prefill-switch "$M.prefill_gemms.ROUND_IN_ENCODE=False|True|False|False|True;\
$M.fp8_blockwise.ROW_TILE=(1, 8)|(32, 1)|(1, 8)|(1, 8)|(32, 1);$M.hc_streams.COLLAPSE_ROWS=0|0|0|1024|1024"
step passes-sites 40 python3 bench/prefill_passes.py --rows 16384 --sections mixes,sites
step indexer-tiles 100 python3 bench/h200.py --sections indexer --budget-s 90
step all-on-1m-32k-chunks 230 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --budget-s 215 --prefill-switch "$M.indexer_score.TALL_FP8=True;$M.prefill_gemms.SWIGLU_ENCODE=True;\
$M.hc_streams.EXPAND_MIX_ROWS=1073741824;$M.fp8_blockwise.FP4_WORDS=True;dsflash.model.layers.indexer.TOP_K_BESIDE=True;\
$M.prefill_gemms.ROUND_IN_ENCODE=True;$M.fp8_blockwise.ROW_TILE=(32, 1);$M.hc_streams.COLLAPSE_ROWS=1024"
