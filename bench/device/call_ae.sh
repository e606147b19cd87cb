# Device call AE (~450 s, any card; an H100 holds it: 16K chunks, no weight kept): call AD's
# Gluon score tiles (GPU test in tiles of 128 and 64 entries, then the forms timed alone), then
# the 1M faithful prefill in the shipped set-up alternated in one process: the Gluon tiles (in
# the entry tile that ran faster alone) on and off (where their test fails, this session's
# three prefill switches on and off instead).
source bench/device/env.sh
step gpu-tests 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py -k "gluon_tall_tiles"
S="dsflash.model.kernels.prefill_gemms.SHARED_EXPERT_OPERAND=True|False;dsflash.model.kernels.hc_streams.SITE_OPERAND=True|False;dsflash.model.kernels.hc_streams.UNREAD_INPUT_LEFT=True|False"
if grep -q "=== gpu-tests rc=0 " "$LOG"; then
  step indexer-fp8 100 python3 bench/h200.py --sections indexer_fp8
  E=$(gluon_entries "${OUT:-/tmp}/indexer-fp8/h200.json"); echo "gluon entries: $E" | tee -a "$LOG"
  S="dsflash.model.kernels.indexer_score.GLUON_TALL=True|False;dsflash.model.kernels.indexer_score_gluon.ENTRIES=$E|128"
fi
step shipped-1m-ab 280 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --budget-s 600 --prefill-switch "$S"
