# Device call T (~300 s, any card): the routed experts' rows encoded once a token and copied
# for each pair (prefill_gemms.EXPERT_ROWS_ENCODED_ONCE, built in the fiftieth session, off
# until this runs): the GPU tests of the FP8 operands, then 32K faithful prefills alternating
# it off and on (its last logits must not change: the same operand bits).
source bench/device/env.sh
step gpu-tests 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_fp8_blockwise.py
if grep -q "=== gpu-tests rc=0 " "$LOG"; then
step prefill-32k 200 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.prefill_gemms.EXPERT_ROWS_ENCODED_ONCE=False|True|False|True" \
  --budget-s 900
fi
