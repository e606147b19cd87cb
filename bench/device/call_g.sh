# Device call G (~500 s, fits an 80 GB H100): the forty-fourth and forty-fifth sessions' GPU
# code checked and its kernels timed, no whole-model prefill: first every GPU test of the
# untimed forms (the one-pass mHC sites and the deferred FFN output, the masked TF32 heads,
# the kept expert encodings, the score tiles' keep and the filtering launch in PTX, exact
# mode's chained parts over long rows, the padded rows), then a long prompt's score slice and
# its top-k three ways (bench/keep_in_scores.py), the top-k on long rows with FILTER_PTX
# switched, and an mHC site's passes at a 16K chunk's rows. `bash bench/device/call_g.sh lite`
# (~380 s) leaves the mHC passes out, where a session's budget is short.
source bench/device/env.sh
step gpu-tests 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py tests/model/test_fp8_blockwise.py tests/model/test_indexer.py tests/model/test_top_k_kernel.py \
  tests/model/test_sparse_attention_gluon.py \
  -k "site or tf32_heads or hc_ or mixes or kept_encoded or taken_into or keep or filter or top_k or fp32 or small_weight or expand_with or padded or rotates"
step keep-in-scores 80 python3 bench/keep_in_scores.py
step top-k-rows 120 python3 bench/top_k_long_rows.py
if [ "${1:-}" != lite ]; then
step site-passes 80 python3 bench/prefill_passes.py --rows 16384 --sections mixes,sites --budget-s 75
fi
