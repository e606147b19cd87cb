# Device call AO (~100 s, any card): call AN's two real failures, mended on the CPU: the bf16
# split expand within a bf16 step of the one-pass one, and the cuBLAS prefill test on seed 11
# (seed 10's faithful logits sit on an FP8 step; bench/order_sensitivity.py).
source bench/device/env.sh
step gpu-tests 90 python3 -m pytest -v -rfE -p no:cacheprovider -p bench.device.failures_now -n 3 \
  tests/model/test_prefill_gemms.py tests/model/test_bf16_streams.py -k "cublas_gives_the_kernels_logits or dots"
