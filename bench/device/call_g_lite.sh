# Device call G, lite (~380 s, an 80 GB H100): G's GPU tests and its two top-k benches, no mHC timing.
source bench/device/env.sh
step gpu-tests 180 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py tests/model/test_indexer.py tests/model/test_top_k_kernel.py \
  -k "site or tf32_heads or hc_ or mixes or kept_encoded or taken_into or keep or filter or top_k or fp32 or small_weight or expand_with or padded"
step keep-in-scores 80 python3 bench/keep_in_scores.py
step top-k-rows 110 python3 bench/top_k_long_rows.py
