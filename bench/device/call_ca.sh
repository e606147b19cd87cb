# Device call CA (sixty-ninth session; kind nvidia-h200 without needs_h200: whichever card
# comes): on an H200, call BU (~420 s: the 1M headline, then the newest kernels' GPU tests) and
# then the decode experts spike; on any other card the spike alone (~150 s). The spike: the
# shipped faithful kernels against the f16 forms on mma.sync, Triton's (BZ's) and Gluon's
# (bench/moe_fp8_gluon.py: the codes loaded into the MMA's operand layout; decoded to e4m3 and
# converted, or straight to f16 by integer instructions: 2.2 SASS instructions a code either way
# at 128 rows, against Triton's 2.5), at 6 and 12 tokens, each checked against float64 products;
# the Gluon form's GPU tests first. Before them, bench/issue_rates.py (~20 s): how fast an SM
# issues each kind of instruction those forms trade (F2FP conversions against PRMT and LOP3).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  source bench/device/call_bu.sh
else
  source bench/device/env.sh
fi
step issue-rates 60 python3 bench/issue_rates.py
step gpu-tests 90 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_moe_fp8_dots_bench.py -k gluon
step moe-gluon-dots 150 python3 bench/moe_fp8_dots.py --tokens 6,12 --dots gluon,f16
