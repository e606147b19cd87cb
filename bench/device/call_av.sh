# Device call AV (~520 s, an H200 with needs_h200; fifty-seventh session): calls AU and AL in
# one machine's start, where an H200 comes first. The rows kernel's GPU tests with only a full
# query's tile counts staged once (STAGED_TILES), then the 1M faithful prefill as shipped, each
# step a process's first run with its compiles inside recorded (compiles_inside, expected 0
# since the top-k's filter kernel stopped specializing on its chunk and pair counts): 32K chunks
# with every weight kept (the fifty-first session's 42.19 s, a first run with ~1.3 s of those
# compiles inside), 48K chunks likewise, and the shipped 16K chunks (44.28 s then).
source bench/device/env.sh
step gpu-tests 90 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/model/test_sparse_attention_gluon.py \
  -k "decoded_form or rows_once or operand or compile"
step kept32k 170 python3 bench/compile_log.py bench/h200.py --sections prefill --act-quant --prefill 1048576 \
  --chunk 32768 --weight-cache-bytes 80e9 --budget-s 200
step kept48k 110 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 49152 \
  --weight-cache-bytes 80e9 --budget-s 200
step shipped-1m 120 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
