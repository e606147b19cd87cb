# Device call AI (~230 s, any card): the FP8 score tiles held to 160 registers a thread
# (indexer_score.TALL_FP8_MAXNREG, 0 shipped) so that the top-k's filtering launch fits beside
# their three programs on every SM (fifty-fourth session: the top-k barely overlapped the
# scores). A 512K faithful prefill in 16K chunks, alternated twice in one process (the same last
# logits expected: the same scores), then the FP8 tiles' GPU test at 160.
source bench/device/env.sh
step maxnreg-512k 200 python3 bench/h200.py --sections prefill --act-quant --prefill 524288 --chunk 16384 \
  --budget-s 400 --prefill-switch "dsflash.model.kernels.indexer_score.TALL_FP8_MAXNREG=0|160|0|160"
step gpu-tests 60 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  -k "faithful_tall_tiles_on_the_fp8"
