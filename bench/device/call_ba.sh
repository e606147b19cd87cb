# Device call BA (~300 s, an H200, needs_h200; fifty-eighth session): call AL's first and last
# steps in the ~500 s of device time left: the 1M faithful prefill as shipped, a process's
# first run each, with every compile logged (none expected inside the timed run: call AU on an
# H100 found none, 46.26 s), in the best set-up so far (32K chunks, every weight kept: 42.19 s
# in the fifty-first session's call W, with ~1.3 s of compiles inside) and with the shipped
# defaults (16K chunks, nothing kept: 44.28 s then).
source bench/device/env.sh
step kept32k 170 python3 bench/compile_log.py bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 80e9 --budget-s 200
step shipped-1m 120 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
