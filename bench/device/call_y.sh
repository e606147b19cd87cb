# Device call Y (~330 s, any card): a faithful prefill chunk's FFN rows encoded once for the shared
# and the routed experts (TritonOps.ffn_operand, under EXPERT_ROWS_ENCODED_ONCE; fifty-first
# session): its GPU tests, 32K prefills alternating the switch (the same last logits: the same
# operand bits), then the profile of an early 16K chunk with every shipped switch (the forty-ninth
# session's was 634 ms of GPU time on an H100).
source bench/device/env.sh
step gpu-tests 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_fp8_blockwise.py \
  tests/model/test_kernels.py -k "ffn_rows or encoded_once or moe"
grep -q "=== gpu-tests rc=0 " "$LOG" || exit 1
step prefill-32k 160 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.prefill_gemms.EXPERT_ROWS_ENCODED_ONCE=False|True|False|True" \
  --budget-s 900
step profile-16k 120 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 --profile \
  --budget-s 900
