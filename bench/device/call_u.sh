# Device call U (~250 s, any card): Engram's gate in one launch (engram_gate.FUSED, built in the
# fiftieth session, off until this runs): its GPU tests (the kernel against the torch form, the
# model's logits), then 32K faithful prefills alternating it off and on (the bench preset's
# two Engram sites, ~13 ms of a 16K chunk in torch's elementwise kernels by the profile).
source bench/device/env.sh
step gpu-tests 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py -k "engram"
if grep -q "=== gpu-tests rc=0 " "$LOG"; then
step prefill-32k 200 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.engram_gate.FUSED=False|True|False|True" --budget-s 900
fi
