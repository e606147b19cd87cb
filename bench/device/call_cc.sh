# Device call CC (~150 s, any card; sixty-ninth session): the decode experts spike alone, for an
# H200 warm after call BU (or BR): the Gluon form's GPU tests, then bench/moe_fp8_dots.py's
# f16 forms (Triton's on mma.sync; Gluon's with and without the prefetch, both decodes) and the
# FP8 wgmma form against the shipped faithful kernels at 6 and 12 tokens. On the H100 (calls
# CA, CB) every f16 form lost (the best Gluon form 250 against 229 us at 6 tokens, Triton's
# 235): there the shipped kernels run within 1.09x of reading their weights; on the H200
# decoding costs ~65% over reading, which these forms' fewer instructions address.
source bench/device/env.sh
step gpu-tests 90 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_moe_fp8_dots_bench.py -k gluon
step moe-f16-forms 200 python3 bench/moe_fp8_dots.py --tokens 6,12 --dots gluon,f16,fp8
