# Device call CE (~200 s, any card; seventieth session): the top-k floor's sample in runs of
# consecutive ids (top_k.SAMPLE_RUN, 1 until timed): the top-k kernels' GPU tests, then
# bench/top_k_long_rows.py's filtered form with runs of 1, 4, 8 and 16 (the floor's launch, the
# whole filtered top-k, the scores a row keeps) at a long prefill's late slices, decode's rows
# and an early chunk's many rows, then bench/top_k_decode.py with runs of 8 against 1.
source bench/device/env.sh
step gpu-tests-top-k 120 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 --timeout 110 tests/model/test_top_k_kernel.py
step top-k-runs 150 python3 bench/top_k_long_rows.py --labels filtered,runs
step top-k-runs-many-rows 100 python3 bench/top_k_long_rows.py --labels filtered,runs \
  --shapes "8192,16383,512;4096,32767,512;2048,65535,512"
step top-k-decode-runs 90 python3 bench/top_k_decode.py --requests 1,8 --variants ";SAMPLE_RUN=8"
