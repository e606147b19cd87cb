# Device call S (~300 s, any card): a prefill chunk's fp32 rows times the routers' and
# compressors' bf16 weights on the TF32 tensor cores (tall_bf16, fiftieth session): its GPU
# tests, its time against the fp32 sgemm and the three bf16 parts at 16,384 rows
# (bench/tall_bf16_products.py), then 32K faithful prefills alternating it off (OUTPUTS 0) and on.
source bench/device/env.sh
step gpu-tests 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py -k "tall_bf16 or small_bf16"
step tall-products 60 python3 bench/tall_bf16_products.py
if grep -q "=== gpu-tests rc=0 " "$LOG"; then
step prefill-32k 200 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.tall_bf16.OUTPUTS=0|1024|0|1024" --budget-s 900
fi
