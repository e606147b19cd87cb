# Device call F (~420 s, H200): a long prompt's top-k, its filtering in the score tiles
# (indexer.KEEP_IN_SCORES, off: no gain on the H100's score slices in the forty-sixth session)
# and the filtering launch in PTX (top_k.FILTER_PTX, on since then, ahead on most H100 shapes),
# in whole 256K faithful prefills where the H100 timed the kernels alone. First the GPU tests,
# then 256K prefills in 16K chunks, alternated in one process: the shipped (PTX filter), the
# Triton filter, the keep in the tiles; last the top-k on long rows (bench/top_k_long_rows.py).
source bench/device/env.sh
step gpu-tests 180 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_indexer.py tests/model/test_top_k_kernel.py -k "keep or filter or top_k"
step keep-256k 200 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --prefill-switch "dsflash.model.layers.indexer.KEEP_IN_SCORES=False|False|True|False|False|True;dsflash.model.kernels.top_k.FILTER_PTX=False|True|False|False|True|False" \
  --budget-s 900
step top-k-rows 120 python3 bench/top_k_long_rows.py
