# Device call A (~490 s): the 1M faithful prefill in 64K chunks, the most the kernel path takes
# in one forward (deepseek_v41.MAX_KERNEL_ROWS; 48.87 s in 16K chunks and 46.58 s in 32K in the
# forty-third session: whether lifting the 65,536-row cap would pay); the indexer's warm-up on
# an empty Triton cache on 16 and on 4 threads (28.7 s on 8, 84.9 s one after another: which
# COMPILE_THREADS to ship); then the GPU-marked tests no call of the forty-third session ran,
# and the compile threads' (their kernel handles made once since that session's review).
source bench/device/env.sh
step defaults-1m-64k-chunks 200 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 65536 \
  --budget-s 195
step warm-up-16-threads 60 python3 bench/indexer_warm_up.py --empty-cache --threads 16
step warm-up-4-threads 70 python3 bench/indexer_warm_up.py --empty-cache --threads 4
step gpu-marked 150 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/model/test_compile_threads.py \
  tests/model/test_cuda_graphs.py \
  tests/model/test_device.py tests/model/test_parallel.py tests/model/test_pdl.py \
  tests/model/test_sparse_attention_gluon.py tests/kvcache/test_mirror.py tests/tiers/test_gpu_worker.py \
  tests/tiers/test_ranks.py
