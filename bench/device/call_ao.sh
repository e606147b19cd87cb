# Device call AO (~400 s, any card): the rest of the GPU suite call AN left unrun (its 430 s
# reached 77% of tests/model and the GPU workers' tests: these files hold the other 123), its
# two mends, and its two tests stopped at 300 s, which ran on the CPU beside fifteen other
# workers each on every core: two torch threads a worker here.
source bench/device/env.sh
export OMP_NUM_THREADS=2
step gpu-suite-rest 390 python3 -m pytest -v -rfE -p no:cacheprovider -p bench.device.failures_now -n 8 --timeout 300 \
  tests/model/test_sparse_attention_gluon.py tests/model/test_top_k_kernel.py tests/model/test_modes.py \
  tests/model/test_golden.py tests/model/test_indexer.py tests/model/test_weights.py tests/model/test_cli_logits.py \
  tests/model/test_ced.py tests/model/test_dspark.py tests/model/test_engram_hash.py tests/model/test_lockstep.py \
  tests/model/test_parallel.py tests/kvcache/test_mirror.py tests/tiers/test_gpu_worker.py tests/tiers/test_ranks.py \
  tests/model/test_prefill_gemms.py tests/model/test_bf16_streams.py \
  "tests/model/test_fp8_blockwise.py::test_every_product_of_a_faithful_chunk_on_the_fp8_tensor_cores_keeps_its_bound"
