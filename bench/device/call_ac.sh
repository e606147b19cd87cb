# Device call AC (~480 s, an H200: the weights kept need more than an H100's 80 GB; needs_h200):
# the 1M faithful prefill with the fifty-second session's three prefill switches on (the shared
# expert's operand shared with the routed experts, the mHC sites writing their input's operand,
# the attention site's unread fp32 input left out) against all three off, alternated in one
# process in the best set-up so far (32K chunks, every weight kept: 42.19 s in the fifty-first
# session's call W); where the Gluon score tiles' GPU test passes first (call AD's), a run with
# them too (indexer_score.GLUON_TALL). Then 48K chunks with every weight kept (32K -> 64K chunks
# saved ~1.9 s with nothing kept, fiftieth session; 64K and the weights do not fit 141 GB; the
# Gluon tiles on where their test passed) and the shipped defaults (16K chunks, nothing kept: 44.28 s).
source bench/device/env.sh
S=$THREE_SWITCHES
P=""
gluon_checked && S="${S//=True|False/=True|True|False};dsflash.model.kernels.indexer_score.GLUON_TALL=True|False|False;dsflash.model.kernels.indexer_score_gluon.QUERIES=$QB|64|64;dsflash.model.kernels.indexer_score_gluon.ENTRIES=$NB|128|128" \
  && P="dsflash.model.kernels.indexer_score.GLUON_TALL=True;dsflash.model.kernels.indexer_score_gluon.QUERIES=$QB;dsflash.model.kernels.indexer_score_gluon.ENTRIES=$NB"
step kept32k-ab 300 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 80e9 --budget-s 600 --prefill-switch "$S"
step kept48k 110 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 49152 \
  --weight-cache-bytes 80e9 --budget-s 200 ${P:+--prefill-switch "$P"}
step shipped-1m 130 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
