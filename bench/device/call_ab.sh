# Device call AB (~200 s, any card): the attention site of a layer that is neither a KV nor an
# index source leaving its fp32 input out (hc_streams.UNREAD_INPUT_LEFT, built in the
# fifty-second session, off until this runs): its GPU tests (the site's operand alone, the
# model's faithful chunk to the bit), then 32K faithful prefills alternating it (the same last
# logits: the same operand bits).
source bench/device/env.sh
step gpu-tests 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_fp8_blockwise.py -k "sites_pass_writes or attention_sites_pass or sites_operands"
grep -q "=== gpu-tests rc=0 " "$LOG" || exit 1
step prefill-32k 150 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.hc_streams.UNREAD_INPUT_LEFT=False|True|False|True" --budget-s 900
