# Device call K (~450 s, any card): the Gluon rows kernel by parts, and its warp-specialized
# form (sparse_attention.PINGPONG_ROWS, forty-eighth session). Its first run (H100,
# docs/bench/h100-2026-12-05-fortyeighth-call-k.txt) found a program's own work (the queries'
# read and rotation, the epilogue's encode: 1.62 of 5.42 ms at 16,384 queries) the largest
# part, and the new form correct but slower (9.0 ms; 32K prefills 1.46 against 1.31 s).
# Since then the queries come 32 rows a pass (8 before) and the epilogue loads its angles once
# (each of its 8 passes did): its second run (-call-k2.txt) had no keys 1.62 -> 1.34 ms, the
# launch 5.42 -> 5.01 ms, 32K 1.28 s and the 1M prefill 50.14 s (51.06 before). Here: the GPU tests of both forms (the rows kernel bit for bit
# against the RoPE launch and rows_1x128; the new form within fp32 rounding of it and as near
# the exact attention); bench/rows_kernel_ablation.py; where they passed, two 32K faithful
# prefills and the 1M one, in 16K chunks (the shipped switches).
source bench/device/env.sh
step gpu-tests 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_sparse_attention_gluon.py \
  -k "operand or decoded_form or warp_specialized or projects or rotates"
step rows-ablation 150 python3 bench/rows_kernel_ablation.py
if grep -q "=== gpu-tests rc=0 " "$LOG"; then
step prefill-32k 100 python3 bench/h200.py --sections prefill --act-quant --prefill 32768,32768 --chunk 16384 \
  --budget-s 900
step plain-1m 185 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 180
fi
