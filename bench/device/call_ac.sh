# Device call AC (~400 s, an H200: the weights kept need more than an H100's 80 GB; needs_h200):
# the 1M faithful prefill with the fifty-second session's three prefill switches on (the shared
# expert's operand shared with the routed experts, the mHC sites writing their input's operand,
# the attention site's unread fp32 input left out) against all three off, alternated in one
# process in the best set-up so far (32K chunks, every weight kept: 42.19 s in the fifty-first
# session's call W), then with the shipped defaults (16K chunks, nothing kept: 44.28 s).
source bench/device/env.sh
step kept32k-ab 250 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 80e9 --budget-s 600 \
  --prefill-switch "dsflash.model.kernels.prefill_gemms.SHARED_EXPERT_OPERAND=True|False;dsflash.model.kernels.hc_streams.SITE_OPERAND=True|False;dsflash.model.kernels.hc_streams.UNREAD_INPUT_LEFT=True|False"
step shipped-1m 130 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
