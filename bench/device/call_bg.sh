# Device call BG (~360 s, an H200, needs_h200; sixtieth session): the 1M headline in the best
# set-up so far (32K chunks, every weight kept: 42.19 s in the fifty-first session, with ~1.3 s
# of compiles inside since removed), a process's first run with its compiles logged, with the
# queries in halves as shipped since call BF (attention_queries.SPLIT_QUERIES), then off and on
# again in the same process (the records' last logits must agree: the same bits). Then the
# shipped defaults (16K chunks, nothing kept: 44.28 s in the fifty-first session).
source bench/device/env.sh
step kept32k-halves 240 python3 bench/compile_log.py bench/h200.py --sections prefill --act-quant --prefill 1048576 \
  --chunk 32768 --weight-cache-bytes 80e9 --budget-s 600 \
  --prefill-switch "dsflash.model.kernels.attention_queries.SPLIT_QUERIES=True|False|True"
step shipped-1m 125 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
