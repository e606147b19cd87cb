# Device call AL (~400 s, an H200, needs_h200: the weights kept need more than an H100's 80 GB):
# the 1M faithful prefill as shipped since the fifty-second session (its three prefill switches
# on; on an H100 they took 0.7 s off the 1M, fifty-third session), never timed on an H200: in
# the best set-up so far (32K chunks, every weight kept: 42.19 s in the fifty-first session's
# call W), in 48K chunks with every weight kept, and with the shipped defaults (16K chunks,
# nothing kept: 44.28 s in the fifty-first). Call AC less its A/B of the three switches.
# Since the fifty-seventh session also the rows kernel's rows staged once with its weighted
# sums in flight, and the top-k's filter unspecialized on its counts: the fifty-first's runs
# were each a process's first, with 1.6 s of those compiles inside (~1.3 s of wall time; call
# AT, H100); the first step logs every compile (bench/compile_log.py).
source bench/device/env.sh
step kept32k 170 python3 bench/compile_log.py bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 80e9 --budget-s 200
step kept48k 110 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 49152 \
  --weight-cache-bytes 80e9 --budget-s 200
step shipped-1m 120 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
