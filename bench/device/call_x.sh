# Device call X (~230 s, an H200: decode's stacked experts beside the bench preset's 46.5 GiB of
# weights ran an H100 out of memory in call V): the mHC mixes' raw TF32 heads at decode
# (hc_streams.RAW_HEADS_AT_DECODE, off until timed) off and on, alternated in one process,
# faithful mode at 4K, batches 1 and 8 (its GPU tests passed in call V).
source bench/device/env.sh
step raw-heads-decode 220 python3 bench/decode_ab.py dsflash.model.kernels.hc_streams.RAW_HEADS_AT_DECODE False True \
  --context 4096 --batches 1,8 --rounds 2 --act-quant --budget-s 210
