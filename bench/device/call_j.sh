# Device call J (~540 s, an H100 or an H200): the rows kernel writing wo_a's FP8 operand itself
# (sparse_attention.ENCODE_IN_ROWS, new in the forty-seventh session). It ran then on an H100
# (docs/bench/h100-2026-12-05-fortyseventh-call-j.txt: the GPU tests passed, 32K 1.326 / 1.327
# -> 1.304 / 1.309 s, the same last logits) and the switch is on. Run it again after changes to
# that epilogue: first its GPU test and the rows kernel's others (bit for bit against the
# inverse RoPE launch and rows_1x128); then 32K faithful prefills in 16K chunks with it off and
# on, alternated in one process (the records' last logits compare: the same bits); on an H200
# (more than 100 GB), the 1M prefill with it on where the tests passed.
source bench/device/env.sh
step gpu-tests 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_sparse_attention_gluon.py \
  tests/model/test_prefill_gemms.py -k "operand or rotates or decoded_form or projects"
step encode-32k 150 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.sparse_attention.ENCODE_IN_ROWS=False|True|False|True" --budget-s 900
# (the 1M run with it on only where the GPU tests passed: else with it off, the shipped switches)
ON=False
grep -q "=== gpu-tests rc=0 " "$LOG" && ON=True
if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ]; then
step encode-1m 170 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.sparse_attention.ENCODE_IN_ROWS=$ON" --budget-s 165
fi
