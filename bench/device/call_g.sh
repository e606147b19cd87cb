# Device call G (~530 s, fits an 80 GB H100): the GPU code built since the forty-third session
# checked and its kernels timed, no whole-model prefill. It ran in the forty-sixth session
# (docs/bench/h100-2026-12-05-fortysixth-call-g.txt), whose decisions stand on it; run it again
# after changes to those kernels. First every GPU test of those forms (the one-pass mHC sites
# and the deferred FFN output, the masked TF32 heads, the kept expert and dense encodings, the
# score tiles' keep and the filtering launch in PTX, exact mode's chained parts over long rows,
# the padded rows, the queries rotated in the attention): 300 s, since on a fresh machine their
# compiles outran 200. Then a long prompt's score slice and its top-k three ways
# (bench/keep_in_scores.py), the top-k on long rows (bench/top_k_long_rows.py), and the rows
# kernel with and without its RoPE (bench/rope_in_rows.py). `bash bench/device/call_g.sh lite`
# (~300 s) runs the tests alone.
source bench/device/env.sh
step gpu-tests 300 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py tests/model/test_fp8_blockwise.py tests/model/test_indexer.py tests/model/test_top_k_kernel.py \
  tests/model/test_sparse_attention_gluon.py \
  -k "site or tf32_heads or hc_ or mixes or kept_encoded or taken_into or keep or filter or top_k or fp32 or small_weight or expand_with or padded or rotates"
if [ "${1:-}" != lite ]; then
step keep-in-scores 80 python3 bench/keep_in_scores.py
step top-k-rows 120 python3 bench/top_k_long_rows.py
step rope-in-rows 30 python3 bench/rope_in_rows.py
fi
