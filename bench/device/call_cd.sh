# Device call CD (~330 s, any card; seventieth session): the top-k's selects by counts, off
# until timed: the floor (top_k.FLOOR_BY_COUNTS) and the pick over kept scores loaded once
# into registers (top_k.PICK_REGISTER_KEYS). The top-k kernels' GPU tests (the floors by counts
# bit for bit the radix passes' floors, the filtered form's picks with either), then
# bench/top_k_long_rows.py: the floor's launch by the radix passes and by counts at 4, 8 and 16
# warps, and the whole filtered form with neither, either and both, at a long prefill's late
# slices, decode's rows and an early chunk's many rows (16K-64K entries); then
# bench/top_k_decode.py's decode rows in CUDA graphs (1 and 8 requests at 1M tokens), with
# neither, either and both. Each long-row shape also probes the filtering launch alone (its
# rows' floors, a floor nothing reaches, torch's amax over the rows). Last, a 4K context's
# decode rows (1,024 entries) through the one-program select, its register form
# (top_k.SELECT_REGISTER_KEYS) against the radix passes.
source bench/device/env.sh
step gpu-tests-top-k 120 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 --timeout 110 tests/model/test_top_k_kernel.py
step top-k-counts 200 python3 bench/top_k_long_rows.py --labels filtered,counts,probe
step top-k-counts-many-rows 120 python3 bench/top_k_long_rows.py --labels filtered,counts,probe \
  --shapes "8192,16383,512;4096,32767,512;2048,65535,512"
step top-k-decode 120 python3 bench/top_k_decode.py --requests 1,8 --variants ";FLOOR_BY_COUNTS=1;PICK_REGISTER_KEYS=8192;FLOOR_BY_COUNTS=1,PICK_REGISTER_KEYS=8192"
step top-k-decode-4k 60 python3 bench/top_k_decode.py --entries 1024 --requests 1,8 --variants ";SELECT_REGISTER_KEYS=4096"
