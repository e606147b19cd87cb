# Device call BT (~150 s with a Triton kit, ~230 s without; any card; sixty-sixth session): after
# BS's A/B put PRODUCT_STREAMS at 2 (H100, 256K: ~1.5% faster than 1), whether 3 streams pay
# more: the 256K faithful prefill in 16K chunks at 2 | 3 | 1 streams, three rounds alternated in
# one process without the warm-up prompts (compare rounds 1 and 2; their last logits must
# match). Carry .triton-kit (bench/device/triton_kit.py) beside .bench, .whl and dsflash/v1.
source bench/device/env.sh
step streams-256k-3 220 python3 bench/decode_ab.py dsflash.model.kernels.prefill_gemms.PRODUCT_STREAMS 2 3 1 \
  --prefill 262144 --chunk 16384 --act-quant --rounds 3 --no-warm-up --budget-s 215
