# Device call CD (~200 s, any card; seventieth session). As it ran on an H100 it also timed
# three selects by counts in the top-k (the floor, the pick over kept scores in registers,
# decode's one-program select), which lost or tied and were removed (performance-log.md, the
# seventieth session's section; its log docs/bench/h100-2026-12-07-seventieth-call-cd.txt).
# What stays: the top-k kernels' GPU tests, then bench/top_k_long_rows.py's filtered form with
# the filtering launch probed alone (the rows' own floors, a floor nothing reaches, torch's amax
# over the same rows) at a long prefill's late slices, decode's rows and an early chunk's many
# rows (16K-64K entries), then bench/top_k_decode.py at 1M and at a 4K context.
source bench/device/env.sh
step gpu-tests-top-k 120 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 --timeout 110 tests/model/test_top_k_kernel.py
step top-k-probe 200 python3 bench/top_k_long_rows.py --labels filtered,probe
step top-k-probe-many-rows 120 python3 bench/top_k_long_rows.py --labels filtered,probe \
  --shapes "8192,16383,512;4096,32767,512;2048,65535,512"
step top-k-decode 120 python3 bench/top_k_decode.py --requests 1,8 --variants ""
step top-k-decode-4k 60 python3 bench/top_k_decode.py --entries 1024 --requests 1,8 --variants ""
