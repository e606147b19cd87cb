# Device call AI (~300 s, any card): the top-k's filtering launch beside the next slice's
# scores (fifty-fourth session: the top-k barely overlapped them). The FP8 score tiles held to
# 160 registers a thread (indexer_score.TALL_FP8_MAXNREG, 0 shipped) leave room for one
# filtering program an SM beside their three; the filtering launch as one program an SM taking
# its (row, chunk) pairs in turn (top_k.FILTER_PROGRAMS, 0 shipped) does not fill the SMs before
# the scores get them. A 512K faithful prefill in 16K chunks, alternated in one process: shipped,
# both, shipped again, the registers alone (each value's first run compiles in its warm-up; the
# same last logits expected); then the GPU tests.
source bench/device/env.sh
step overlap-512k 250 python3 bench/h200.py --sections prefill --act-quant --prefill 524288 --chunk 16384 \
  --budget-s 260 --prefill-switch "dsflash.model.kernels.indexer_score.TALL_FP8_MAXNREG=0|160|0|160;dsflash.model.kernels.top_k.FILTER_PROGRAMS=0|1|0|0"
step gpu-tests 60 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_top_k_kernel.py -k "faithful_tall_tiles_on_the_fp8 or filtering_launchs_programs"
