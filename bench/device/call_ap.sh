# Device call AP (~330 s, any card): sparse_attention_gluon.ROWS_ONCE (fifty-sixth session,
# untimed): the rows kernel stages every key tile's rows before its loop, where it staged them
# two tiles ahead into three rotating buffers; sm_90 SASS 11 -> 9 CTA barriers and 733 -> 691
# instructions a tile, 228 -> 218 registers. The same keys and order: the same bits. Its GPU
# tests (the decoded form against the byte form, bit for bit, either way), the kernel alone at
# a 16K chunk's shape (its loop's skeleton too), then a 256K faithful prefill alternated.
source bench/device/env.sh
step gpu-tests 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_sparse_attention_gluon.py \
  -k "decoded_form or rows_once or operand"
step rows-ablation 60 python3 bench/rows_kernel_ablation.py --only "SKIP=0,rows_once,SKIP=30,rows_once_SKIP=30"
if grep -q "=== gpu-tests rc=0 " "$LOG"; then
step rows-once-256k 200 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --budget-s 600 --prefill-switch "dsflash.model.kernels.sparse_attention_gluon.ROWS_ONCE=False|True|False|True"
fi
