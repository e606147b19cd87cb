# Device call BS (~200 s, any card; sixty-fifth session, for a budget's last minutes): call BN's
# A/B without the prefill warm-up, whose prompts (SHORT_WARM_UPS, the experts' block heights,
# the batched step: sixty-first and sixty-second sessions) outlasted BN's 240 s step on a fresh
# H100's empty Triton cache. A 256K faithful prefill in 16K chunks at 1 and 2 streams
# (prefill_gemms.PRODUCT_STREAMS), three rounds alternated in one process: the first round
# compiles what it meets, so compare the later two (their last logits compare too). Every
# thread's stack goes to the log each 40 s (with_stacks.py): where the time goes if it outlives
# its step again.
# Sixty-sixth session (H100): the first round, on an empty Triton cache, took 82 s (~11 s of it
# prefilling) and the budget then skipped the other five (it counted the compiles: no longer);
# the A/B ran on the warm machine after it (2 streams ~1.5% faster: PRODUCT_STREAMS is 2 now).
source bench/device/env.sh
step streams-256k 190 python3 bench/device/with_stacks.py 40 bench/decode_ab.py \
  dsflash.model.kernels.prefill_gemms.PRODUCT_STREAMS 1 2 --prefill 262144 --chunk 16384 --act-quant --rounds 3 \
  --no-warm-up --budget-s 185
