# Device call Y (~250 s, any card): a faithful prefill chunk's FFN rows encoded once for the shared
# and the routed experts (TritonOps.ffn_operand, prefill_gemms.SHARED_EXPERT_OPERAND, built in the
# fifty-first session, off until this runs): its GPU tests, then 32K prefills alternating the
# switch (the same last logits: the same operand bits).
source bench/device/env.sh
step gpu-tests 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_fp8_blockwise.py \
  tests/model/test_kernels.py -k "ffn_rows or encoded_once or moe"
grep -q "=== gpu-tests rc=0 " "$LOG" || exit 1
step prefill-32k 150 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.prefill_gemms.SHARED_EXPERT_OPERAND=False|True|False|True" \
  --budget-s 900
