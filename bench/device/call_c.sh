# Device call C (~540 s): the forty-first session's two encode changes at 32K (faithful mode's
# 1 x 32 rounding inside the products' operand encode, and the encode in 32-row tiles; off / on
# / off / on), the indexer's FP8 tall tiles against the bf16 ones at 128 queries x 1M entries
# (bit for bit where exact), and the 1M faithful prefill in 32K chunks with every switch on (a
# 32K chunk spreads the experts' weight encode, ~33 ms, over twice the tokens).
source bench/device/env.sh
M=dsflash.model.kernels
step encodes-32k 170 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --budget-s 160 --prefill-switch "$M.prefill_gemms.ROUND_IN_ENCODE=False|True|False|True;\
$M.fp8_blockwise.ROW_TILE=(1, 8)|(32, 1)|(1, 8)|(32, 1)"
step indexer-tiles 110 python3 bench/h200.py --sections indexer --budget-s 100
step all-on-1m-32k-chunks 260 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --budget-s 245 --prefill-switch "$M.indexer_score.TALL_FP8=True;$M.prefill_gemms.SWIGLU_ENCODE=True;\
$M.hc_streams.EXPAND_MIX_ROWS=1073741824;$M.fp8_blockwise.FP4_WORDS=True;dsflash.model.layers.indexer.TOP_K_BESIDE=True;\
$M.prefill_gemms.ROUND_IN_ENCODE=True;$M.fp8_blockwise.ROW_TILE=(32, 1)"
