# Device call BC (~300 s, any card; fifty-ninth session): what the attention's queries cost in
# bytes at a 16K chunk (bench/query_bytes.py): wq_b's product with fp32, bf16 and split outputs
# on cuBLAS, and the rows kernel reading fp32 or bf16 queries; then the rows kernel's GPU tests
# (its query load now casts to fp32 before the rotation: a no-op on the shipped fp32 queries).
source bench/device/env.sh
step query-bytes 150 python3 bench/query_bytes.py
step gluon-tests 200 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/model/test_sparse_attention_gluon.py
