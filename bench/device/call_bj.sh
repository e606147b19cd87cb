# Device call BJ (~330 s, an H200: the bench preset's decode does not fit an H100; sixty-first
# session): the transposed GEMM's row count left unspecialized and its split parts at 16-element
# starts (fp8_gemm: ROWS_SPECIALIZED off, the warm-up's 40- and 45-token prompts dropped). Its GPU
# tests, then decode steps at batch 1 and 8 with the form specialized on the row count and
# without, alternated in one process (the question the item 6 asked: does it cost decode
# time).
source bench/device/env.sh
step gemm-tests 90 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/model/test_kernels.py \
  -k "fp8_gemm or split or rows_product or fp32_gemm or bf16_gemm"
step rows-ab 240 python3 bench/decode_ab.py dsflash.model.kernels.fp8_gemm.ROWS_SPECIALIZED False True \
  --batches 1,8 --rounds 2 --budget-s 230
