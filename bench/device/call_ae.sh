# Device call AE (~300 s, any card; an H100 holds it: 16K chunks, no weight kept): call AD's
# Gluon score tiles (GPU test in tiles of 128 and 64 entries, then the forms timed alone), then
# the 1M faithful prefill in the shipped set-up alternated in one process: the Gluon tiles (in
# the entry tile that ran faster alone) on and off (where their test fails, this session's
# three prefill switches on and off instead).
source bench/device/env.sh
S=$THREE_SWITCHES
gluon_checked && S="dsflash.model.kernels.indexer_score.GLUON_TALL=True|False;dsflash.model.kernels.indexer_score_gluon.QUERIES=$QB|64;dsflash.model.kernels.indexer_score_gluon.ENTRIES=$NB|128"
step shipped-1m-ab 280 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --budget-s 600 --prefill-switch "$S"
