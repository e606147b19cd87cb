# Device call E (~330 s): the decode rows' fp32 products (the mHC mixes, fp8_gemm's skinny kernel
# on an fp32 weight: 86 launches a step) and the decode FFN site's expand-with-mixes kernel in
# masked TF32 heads (common.TF32_HEADS, built on the CPU in the forty-fourth session, off until
# timed; sm_90 SASS: the skinny kernel's loop 652 -> 455 instructions a thread): first the GPU
# tests of the fp32 products and the decode sites (and whether exact mode's chained bf16 parts keep
# fp32 accuracy over 16,384 columns: test_exact_fp8_products_keep_fp32_accuracy_over_long_rows,
# forty-fifth session), then decode steps with it off and on,
# alternated in one process, faithful mode at 4K, batches 1 and 8.
source bench/device/env.sh
step gpu-tests 100 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  -k "fp32_gemm or small_weight or expand_with or tf32_heads or keep_fp32_accuracy"
step tf32-heads-decode 220 python3 bench/decode_ab.py dsflash.model.kernels.common.TF32_HEADS False True \
  --context 4096 --batches 1,8 --rounds 2 --act-quant --budget-s 210
