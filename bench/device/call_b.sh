# Device call B (~540 s): each indexer score slice's top-k beside the next slice's scores at 256K
# (off / on / off / on), the 1M faithful prefill with every prefill switch on in 16K chunks
# (the 40 s target), and the CUDA graph tests alone (owed since the thirty-eighth session).
source bench/device/env.sh
M=dsflash.model.kernels
step top-k-beside-256k 200 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --budget-s 185 --prefill-switch "dsflash.model.layers.indexer.TOP_K_BESIDE=False|True|False|True"
step all-on-1m 230 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --budget-s 215 --prefill-switch "$M.indexer_score.TALL_FP8=True;$M.prefill_gemms.SWIGLU_ENCODE=True;\
$M.hc_streams.EXPAND_MIX_ROWS=1073741824;$M.fp8_blockwise.FP4_WORDS=True;dsflash.model.layers.indexer.TOP_K_BESIDE=True;\
$M.prefill_gemms.ROUND_IN_ENCODE=True;$M.fp8_blockwise.ROW_TILE=(32, 1);$M.hc_streams.COLLAPSE_ROWS=1024"
step cuda-graphs 100 python3 -m pytest -q -p no:cacheprovider tests/model/test_cuda_graphs.py
