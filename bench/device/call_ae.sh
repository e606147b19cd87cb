# Device call AE (~250 s, any card; an H100 holds it: 16K chunks, no weight kept): call AD's
# Gluon score tiles (GPU test, then both forms timed alone), then the 1M faithful prefill in the
# shipped set-up alternated in one process: the Gluon tiles on and off (where their test fails,
# this session's three prefill switches on and off instead).
source bench/device/env.sh
step gpu-tests 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py -k "gluon_tall_tiles"
S="dsflash.model.kernels.prefill_gemms.SHARED_EXPERT_OPERAND=True|False;dsflash.model.kernels.hc_streams.SITE_OPERAND=True|False;dsflash.model.kernels.hc_streams.UNREAD_INPUT_LEFT=True|False"
grep -q "=== gpu-tests rc=0 " "$LOG" && S="dsflash.model.kernels.indexer_score.GLUON_TALL=True|False" && step indexer-fp8 90 python3 bench/h200.py --sections indexer_fp8
step shipped-1m-ab 260 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --budget-s 600 --prefill-switch "$S"
