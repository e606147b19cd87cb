# Device call CE (~420 s on an H200 with the kit, ~330 on an H100; seventieth session): the
# top-k's selects by counts at 1M. Call CD's GPU tests of the top-k kernels, then the 1M
# faithful prefill as call BR sets it up (an H200: 32K chunks with every weight kept, the
# headline's; an H100: the shipped 16K chunks), no warm-up, with top_k.FLOOR_BY_COUNTS and
# top_k.PICK_REGISTER_KEYS on | off | on | off | on in one process: run 0 carries the compiles
# of the changed kernels, runs 1-4 alternate. The same last logits in all five say the picks
# agree; runs 1 and 3 are the shipped code's 1M.
source bench/device/env.sh
step gpu-tests-top-k 120 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 --timeout 110 tests/model/test_top_k_kernel.py
CHUNK=16384
KEEP=0
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then CHUNK=32768; KEEP=80e9; fi
step counts-1m 440 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk $CHUNK \
  --weight-cache-bytes $KEEP --budget-s 600 --no-warm-up --prefill-switch "dsflash.model.kernels.top_k.FLOOR_BY_COUNTS=True|False|True|False|True;dsflash.model.kernels.top_k.PICK_REGISTER_KEYS=8192|0|8192|0|8192"
