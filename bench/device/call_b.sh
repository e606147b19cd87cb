# Device call B (~500 s): the fast path against the plain-PyTorch reference at
# decode (25.7x was measured when a step took 38.9 ms; it takes ~21 ms now), then every kernel
# test on the GPU.
source bench/device/env.sh
step reference-4k-b1 300 python3 bench/h200.py --sections decode,reference --contexts 4096 --batches 1 --budget-s 280
step kernel-tests 190 python3 -m pytest -q -p no:cacheprovider tests/model/test_kernels.py tests/model/test_quant_kernels.py
