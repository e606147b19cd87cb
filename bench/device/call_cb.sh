# Device call CB (sixty-ninth session; kind nvidia-h200 without needs_h200: whichever card
# comes): on an H200, call BU first (~420 s: the 1M headline, then the newest kernels' GPU
# tests); on any card the Gluon form of the decode experts spike (bench/moe_fp8_gluon.py) with
# each chunk's loads issued a chunk ahead (PREFETCH) against the same loop without, and
# split_f16's integer decode, at 2-pair blocks, against the shipped faithful kernels and
# Triton's f16 form, 6 and 12 tokens (~120 s), after the form's GPU tests. Call CA (an H100)
# found the Gluon form exact and 239-242 us at 6 tokens against the shipped 224 without the
# prefetch.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bu.sh
else
  source bench/device/env.sh
fi
step gpu-tests 90 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_moe_fp8_dots_bench.py -k gluon
step moe-gluon-prefetch 150 python3 bench/moe_fp8_dots.py --tokens 6,12 --dots gluon,f16
