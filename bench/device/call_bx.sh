# Device call BX (~270 s, any card; sixty-eighth session): faithful mode's decode experts on the
# FP8 tensor cores (bench/moe_fp8_dots.py: FP4 codes decoded straight to e4m3, one FP8 MMA a
# 32-column block) against the shipped faithful kernels at 6 and 12 tokens: 2- and 4-pair
# blocks, two byte layouts, two tiles, activations gathered or laid out, each checked against
# float64 products; then the shipped exact kernels' floors. Ran on an H100 in the sixty-eighth
# session (the FP8 form lost: 250 against 229 us at 6 tokens).
source bench/device/env.sh
step moe-fp8-dots 240 python3 bench/moe_fp8_dots.py --tokens 6,12
# the shipped exact kernels' floors on the same card: reading alone, reading and decoding
step moe-floor 90 python3 bench/moe_floor.py
