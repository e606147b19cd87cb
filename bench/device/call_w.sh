# Device call W (~420 s, an H200: the weights kept need more than an H100's 80 GB): the 1M
# faithful prefill with the fiftieth session's three prefill changes on (tall_bf16 at the routers
# and compressors, the experts' rows encoded once, Engram's gate in one launch) against all three
# off, alternated in one process in the best set-up so far (32K chunks, every weight kept: 43.43 s
# in call Q), then with the shipped defaults (16K chunks, nothing kept: 46.19 s). First the GPU
# tests of the two switches turned on in the fifty-first session.
source bench/device/env.sh
step gpu-tests 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_prefill_gemms.py \
  tests/model/test_fp8_blockwise.py tests/model/test_kernels.py -k "engram or encoded_once or gathered"
grep -q "=== gpu-tests rc=0 " "$LOG" || exit 1
step kept32k-ab 240 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 80e9 --budget-s 600 \
  --prefill-switch "dsflash.model.kernels.tall_bf16.OUTPUTS=1024|0;dsflash.model.kernels.prefill_gemms.EXPERT_ROWS_ENCODED_ONCE=True|False;dsflash.model.kernels.engram_gate.FUSED=True|False"
step shipped-1m 130 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
