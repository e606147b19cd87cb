# Device call I (~450 s, an 80 GB H100): whole-model faithful prefills of the bench preset,
# which fit an H100 since bench/h200.py holds the routed experts stacked once (46.5 GiB of
# weights; stacked beside their per-expert tensors they ran out of memory in the forty-sixth
# session). For a session whose only machine is an H100: 32K prefills in 16K chunks with 10 GB
# of weights kept encoded (--weight-cache-bytes) off and on, alternated; the queries' RoPE in
# the rows kernel (ROPE_IN_ROWS) off and on, alternated; a 256K prefill with the shipped
# switches (the chunks' growth with the context). Compare with H200 figures only as ratios.
source bench/device/env.sh
step cache-32k 150 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --weight-cache-bytes 0,10e9,0,10e9 --budget-s 140
step rope-32k 130 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.sparse_attention.ROPE_IN_ROWS=False|True|False|True" --budget-s 120
step prefill-256k 150 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --budget-s 140
