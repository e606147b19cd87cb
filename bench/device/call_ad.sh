# Device call AD (~150 s, any card): faithful prefill's FP8 tall score tiles in Gluon, a head's
# wgmma under the previous head's epilogue (indexer_score.GLUON_TALL, built in the fifty-second
# session, off until this runs): its GPU test (the Triton tiles' scores bit for bit), then both
# forms timed at a 1M prompt's 128 x 1M slice and at 2,048 x 16K (bench/h200.py --sections
# indexer_fp8: fp8_tall_encoded against fp8_tall_encoded_gluon, equal_to_fp8_tall_encoded).
source bench/device/env.sh
step gpu-tests 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py -k "gluon_tall_tiles"
grep -q "=== gpu-tests rc=0 " "$LOG" || exit 1
step indexer-fp8 150 python3 bench/h200.py --sections indexer_fp8
