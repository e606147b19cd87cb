# Device call F (~420 s): a long prompt's top-k filtered where its scores are made
# (indexer.KEEP_IN_SCORES, built on the CPU in the forty-fifth session, off until timed): each
# score slice's floors from the scores of top_k.SAMPLE sampled entries first, then the tall
# tiles' epilogue keeps the scores reaching them (in PTX, a branch a score: for sm_90 no more
# registers, ~6 issued instructions a score), so the filtering launch (63 ms of the last 1M
# chunk, on the side stream) does not read the scores back. First the GPU tests (the kernels'
# PTX form against the top-k's reference, the prefill's logits the same with it on), then 256K
# faithful prefills in 16K chunks with it off and on, alternated in one process, and between
# them the filtering launch itself in the same PTX (top_k.FILTER_PTX: for sm_90 ~8 issued
# instructions a score where Triton's form takes ~41); last the top-k on long rows with
# FILTER_PTX on (bench/top_k_long_rows.py: 0.59 ms for 128 x 1M, k = 512, in the seventeenth
# session).
source bench/device/env.sh
step gpu-tests 100 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_indexer.py tests/model/test_top_k_kernel.py -k "keep or filter or top_k"
step keep-256k 200 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --prefill-switch "dsflash.model.layers.indexer.KEEP_IN_SCORES=False|False|True|False|False|True;dsflash.model.kernels.top_k.FILTER_PTX=False|True|False|False|True|False" \
  --budget-s 195
step top-k-rows 120 python3 bench/top_k_long_rows.py
