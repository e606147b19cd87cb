# Device call D (~550 s, H200): the GPU tests of the forms built since the forty-third session
# (all passed on an H100 in the forty-sixth), the mHC site's passes at an H200's bandwidth
# (on the H100 the one pass lost: its mixes' dots bind it, not the streams' bytes), 32K
# faithful prefills with the weights kept encoded (--weight-cache-bytes, the routed experts'
# encode 21 ms a 16K chunk, the dense weights' ~3-6) off and on, alternated, and last the 1M
# faithful prefill in 16K chunks with 40 GB of them kept (48.87 s with none in the forty-third
# session, on another machine).
source bench/device/env.sh
step gpu-tests 180 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py tests/model/test_fp8_blockwise.py tests/model/test_sparse_attention_gluon.py \
  -k "site or tf32_heads or hc_ or mixes or kept_encoded or taken_into or rotates"
step site-passes 80 python3 bench/prefill_passes.py --rows 16384 --sections mixes,sites --budget-s 75
step cache-32k 100 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --weight-cache-bytes 0,40e9,0,40e9 --budget-s 900
step cache-1m 185 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --weight-cache-bytes 40e9 --budget-s 180
