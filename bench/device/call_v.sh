# Device call V (~420 s, any card): why call U's model-logits test of engram_gate.FUSED moved one
# next token on the GPU (the kernel test passed): both gate forms on the same inputs at each of
# the tiny checkpoint's Engram sites, and the logits off/off/on/on in both modes; then U's 32K
# A/B; then a decode A/B of the mHC mixes' raw TF32 heads at decode (RAW_HEADS_AT_DECODE) after
# their GPU tests.
source bench/device/env.sh
step engram-diag 120 python3 bench/engram_gate_check.py
step prefill-32k 170 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --prefill-switch "dsflash.model.kernels.engram_gate.FUSED=False|True|False|True" --budget-s 900
step raw-tests 60 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py -k "raw"
grep -q "=== raw-tests rc=0 " "$LOG" || exit 1
step raw-heads-decode 200 python3 bench/decode_ab.py dsflash.model.kernels.hc_streams.RAW_HEADS_AT_DECODE False True \
  --context 4096 --batches 1,8 --rounds 2 --act-quant --budget-s 190
