# Device call BJ (sixty-first session; 139 s on an H100 in the sixty-third, which the bench
# preset's decode fits since that session's bench holds the routed experts once): the
# transposed GEMM's row count left unspecialized and its split parts at 16-element starts
# (fp8_gemm._skinny_kernel, _outputs; the warm-up's 40- and 45-token prompts dropped). Its GPU
# tests, then 4K decode steps at batch 1 and 8 as shipped, with the row count specialized again
# (the kernel's do_not_specialize taken out by sed), and as shipped again: three processes back
# to back (the question the item 6 asked: does it cost decode time). A call that
# sources this one may set DECODE_S, each decode process's limit (call BM: a slower H100).
source bench/device/env.sh
DECODE_S=${DECODE_S:-100}
DECODE_BUDGET=$((DECODE_S - 5))
step gemm-tests 90 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/model/test_kernels.py \
  -k "fp8_gemm or split or rows_product or fp32_gemm or bf16_gemm"
step rows-free-1 $DECODE_S python3 bench/h200.py --sections decode --contexts 4096 --batches 1,8 \
  --budget-s $DECODE_BUDGET
sed -i 's/^@triton.jit(do_not_specialize=\["M"\])  # rows unspecialized$/@triton.jit  # rows specialized (call BJ)/' \
  model/kernels/fp8_gemm.py
grep -n "rows specialized (call BJ)" model/kernels/fp8_gemm.py | tee -a "$LOG"
step rows-specialized $DECODE_S python3 bench/h200.py --sections decode --contexts 4096 --batches 1,8 \
  --budget-s $DECODE_BUDGET
git checkout -- model/kernels/fp8_gemm.py 2>/dev/null || sed -i 's/^@triton.jit  # rows specialized (call BJ)$/@triton.jit(do_not_specialize=["M"])  # rows unspecialized/' model/kernels/fp8_gemm.py
step rows-free-2 $DECODE_S python3 bench/h200.py --sections decode --contexts 4096 --batches 1,8 \
  --budget-s $DECODE_BUDGET
