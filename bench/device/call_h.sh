# Device call H (~530 s): calls D, F and G in one where a session can start one machine only:
# the GPU tests of the untimed forms (D's and F's, and the attention's queries rotated as the
# Gluon form reads them), the 32K faithful prefills alternated twice over: all off; the
# one-pass sites with the TF32 heads; with the deferred FFN output too; with the queries'
# RoPE in the attention too (sparse_attention.ROPE_IN_ROWS); a score slice's top-k three ways
# (G's bench/keep_in_scores.py); and last the 1M prefill with all of them on and the weights
# kept encoded (--weight-cache-bytes 40e9).
source bench/device/env.sh
step gpu-tests 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py tests/model/test_fp8_blockwise.py tests/model/test_indexer.py tests/model/test_top_k_kernel.py \
  tests/model/test_sparse_attention_gluon.py \
  -k "site or tf32_heads or hc_ or mixes or kept_encoded or taken_into or keep or filter or ptx or rotates"
step sites-32k 115 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.hc_streams.SITE_ROWS=0|4096|4096|4096|0|4096|4096|4096;dsflash.model.kernels.common.TF32_HEADS=False|True|True|True|False|True|True|True;dsflash.model.kernels.hc_streams.DEFER_FFN_EXPAND=False|False|True|True|False|False|True|True;dsflash.model.kernels.sparse_attention.ROPE_IN_ROWS=False|False|False|True|False|False|False|True" \
  --budget-s 110
step keep-in-scores 80 python3 bench/keep_in_scores.py
step sites-1m 185 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.hc_streams.SITE_ROWS=4096;dsflash.model.kernels.common.TF32_HEADS=True;dsflash.model.kernels.sparse_attention.ROPE_IN_ROWS=True" \
  --weight-cache-bytes 40e9 --budget-s 180
