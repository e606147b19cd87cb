# Device call AG (~220 s, any card): the priority of the stream the index top-k runs on beside
# the next slice's scores (indexer.TOP_K_SIDE_PRIORITY, 0 shipped, -1 the top-k's programs
# first), a 512K faithful prefill in 16K chunks alternated twice in one process (the scores
# and their top-k are ~30% of a late 1M chunk; the same last logits expected).
source bench/device/env.sh
step side-priority-512k 230 python3 bench/h200.py --sections prefill --act-quant --prefill 524288 --chunk 16384 \
  --budget-s 400 --prefill-switch "dsflash.model.layers.indexer.TOP_K_SIDE_PRIORITY=0|-1|0|-1"
