# Device call Z (~370 s, any card): the mHC sites' passes writing their input's FP8 operand (for
# wq_a and wkv; for the shared and the routed experts) (hc_streams.SITE_OPERAND, built in the
# fifty-first session, off until this runs): its GPU tests (the operand to the bit of
# rows_1x128's, the handoffs to attention.project and moe), the sites' launches with and without
# it (bench/prefill_passes.py: *_then_encoded against *_encoding_in_the_pass), then 32K faithful
# prefills alternating it (the same last logits: the same operand bits). After call Y.
source bench/device/env.sh
step gpu-tests 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_fp8_blockwise.py -k "fp8_operand or site_in_one_pass or attention_sites_pass or ffn_rows or rows_are or sites_operands"
grep -q "=== gpu-tests rc=0 " "$LOG" || exit 1
step site-passes 120 python3 bench/prefill_passes.py --rows 16384 --sections sites --budget-s 110
step prefill-32k 150 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.hc_streams.SITE_OPERAND=False|True|False|True" --budget-s 900
