# Device call A (~530 s): the GPU tests of the paths not yet run on a GPU (every one, not stopping at
# a failure), the encodes' timings, and a 32K faithful prefill with the four older untimed prefill
# switches all off / all on / off / on in one process (alternating, so a clock drift shows as
# off-off or on-on disagreement).
source bench/device/env.sh
M=dsflash.model.kernels
step gpu-tests 170 python3 -m pytest -q -p no:cacheprovider tests/model/test_fp8_blockwise.py \
  tests/model/test_prefill_gemms.py tests/model/test_bench_limits.py tests/model/test_indexer.py
step mhc-kernel-tests 40 python3 -m pytest -q -p no:cacheprovider tests/model/test_kernels.py \
  -k "one_pass or expand or mixes or collapse"
step encodes 80 python3 bench/fp8_scaled_mm.py
step switches-32k 240 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --budget-s 225 --prefill-switch "$M.indexer_score.TALL_FP8=False|True|False|True;\
$M.prefill_gemms.SWIGLU_ENCODE=False|True|False|True;\
$M.hc_streams.EXPAND_MIX_ROWS=256|1073741824|256|1073741824;$M.fp8_blockwise.FP4_WORDS=False|True|False|True"
