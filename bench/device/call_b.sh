# Device call B (~500 s): faithful decode steps at 4K and 1M context, batches 1, 8 and 32 (the
# table's faithful column lacks 1M at batch 1 and 32 and 4K at batch 2 and 4; the decode code is
# the thirty-sixth session's), then exact mode's at 1M, batch 1 (23.05 ms, thirty-fourth).
source bench/device/env.sh
step faithful-decode 330 python3 bench/h200.py --sections decode --act-quant --contexts 4096,1048576 \
  --batches 1,2,4,8,32 --budget-s 320
step exact-decode-1m-b1 150 python3 bench/h200.py --sections decode --contexts 1048576 --batches 1 --budget-s 140
