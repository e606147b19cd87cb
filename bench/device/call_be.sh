# Device call BE (~270 s, any card; fifty-ninth session): the attention's queries in halves
# (attention_queries.SPLIT_QUERIES: wq_b writes each head's first 384 channels in bf16, the rest
# in fp32, and the Gluon rows kernel reads them so). A 256K faithful prefill in 16K chunks
# alternated off, on, off in one process (its records' last logits compare); then the GPU tests
# of the halves (the product's channels against the whole product, the rows kernel's outputs and
# operand against the whole queries', a faithful prefill's logits). What the bytes cost on each
# side alone is call BC's (bench/query_bytes.py), left for a later call.
source bench/device/env.sh
step halves-256k 150 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --budget-s 300 --prefill-switch "dsflash.model.kernels.attention_queries.SPLIT_QUERIES=False|True|False"
step halves-tests 110 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/model/test_query_halves.py \
  tests/model/test_sparse_attention_gluon.py -k "halves or rotates or wo_as_operand"
