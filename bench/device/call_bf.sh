# Device call BF (~560 s, any card; sixtieth session): the rows kernel's keys copied a whole tile
# ahead (sparse_attention_gluon.COPY_AHEAD) and the attention's queries in halves
# (attention_queries.SPLIT_QUERIES). First their GPU tests (the same bits as the byte form and as
# the shipped order; the joined-halves test fixed after call BE), then the rows kernel alone at a
# 16K chunk in both loop orders on a prompt's rows and on random rows (bench/rows_kernel_ablation.py),
# then the 1M faithful prefill in the shipped 16K chunks, one process: neither, copy-ahead, halves,
# both (each switch's first run compiles its rows kernel forms inside: see compiles_inside).
source bench/device/env.sh
step gluon-tests 120 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/model/test_query_halves.py \
  tests/model/test_sparse_attention_gluon.py -k "byte_form or wo_as_operand or halves or rotates"
step rows-orders 80 python3 bench/rows_kernel_ablation.py \
  --only "in_flight,copy_ahead,in_flight_random_rows,copy_ahead_random_rows"
step orders-1m 340 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --budget-s 600 --prefill-switch "dsflash.model.kernels.sparse_attention_gluon.COPY_AHEAD=False|True|False|True;dsflash.model.kernels.attention_queries.SPLIT_QUERIES=False|False|True|True"
