# Device call AP (~500 s, any card): sparse_attention_gluon.ROWS_ONCE and PV_IN_FLIGHT
# (fifty-sixth session, untimed). The rows kernel stages every key tile's rows before its loop,
# where it staged them two tiles ahead into three rotating buffers (sm_90 SASS: 11 -> 9 CTA
# barriers and 733 -> 690 instructions a tile); with it each tile's weighted sum stays in flight
# into the next tile, under its key wait and barriers (679 instructions, no wgmma serialized).
# The same keys and order: the same bits. Their GPU tests (the decoded form against the byte
# form, bit for bit, each way), the kernel alone at a 16K chunk's shape, then a 256K faithful
# prefill alternated: shipped, rows once, both.
source bench/device/env.sh
step gpu-tests 230 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/model/test_sparse_attention_gluon.py \
  -k "decoded_form or rows_once or operand or compile"
step rows-ablation 60 python3 bench/rows_kernel_ablation.py --only "SKIP=0,rows_once,in_flight,SKIP=30,rows_once_SKIP=30"
if grep -q "=== gpu-tests rc=0 " "$LOG"; then
step rows-once-256k 240 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --budget-s 600 --prefill-switch "dsflash.model.kernels.sparse_attention_gluon.ROWS_ONCE=False|True|True|False|True|True;\
dsflash.model.kernels.sparse_attention_gluon.PV_IN_FLIGHT=False|False|True|False|False|True"
fi
