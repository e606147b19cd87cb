# Device call BZ (~90 s, any card; sixty-eighth session): after BX, the spike's dots in f16 on
# mma.sync (bench/moe_fp8_dots.py --dots f16: the e4m3 codes converted to f16, exact, so the
# sums are fp32's; no trip through shared memory a dot) against the shipped faithful kernels and
# the FP8 wgmma form, at 6 and 12 tokens. Ran on an H100 in the sixty-eighth session (236
# against 224 us at 6 tokens); next on an H200.
source bench/device/env.sh
step moe-f16-dots 150 python3 bench/moe_fp8_dots.py --tokens 6,12 --dots f16,fp8
