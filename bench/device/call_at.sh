# Device call AT (~220 s, any card; fifty-seventh session): what a process's first 1M prefill
# compiles inside its timed run. The first run in a process was slower than the next where
# the context passed 128K, 256K and 512K (calls AP and AQ, H100: +0.66 s in 131K-196K, +0.7 s
# in 262K-393K, +0.3 s in 524K-655K, either form of the rows kernel first), which the
# indexer's warm-up should have compiled. Every compile logged (bench/compile_log.py: when,
# how long, the kernel, its shape constexprs), then the same prefill again in that process.
source bench/device/env.sh
step compiles-1m 200 python3 bench/compile_log.py bench/h200.py --sections prefill --act-quant --prefill 1048576 \
  --chunk 16384 --budget-s 400 --prefill-switch "dsflash.model.kernels.sparse_attention_gluon.ROWS_ONCE=True|True"
