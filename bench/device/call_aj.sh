# Device call AJ (~560 s, any card): faithful mode's streams in bf16 (layers/mhc.BF16_STREAMS,
# off: the reference inference code stores them so; half the bytes of every pass over the
# [T, 4, 5120] streams, 1.34 -> 0.67 GB at a 16K chunk), first its GPU tests, then a 256K
# faithful prefill in 16K chunks alternated off / on in one process (the mHC passes cost the
# same at every chunk, so 256K shows a chunk's saving; the last logits differ by design); then
# call AI's A/B of the top-k's overlap switches and their GPU tests. (Ran in the fifty-fifth
# session, the 256K A/B then under --budget-s 160, which left room for its first run only.)
source bench/device/env.sh
step gpu-tests-streams 90 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_bf16_streams.py
step streams-256k 150 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --budget-s 600 --prefill-switch "dsflash.model.layers.mhc.BF16_STREAMS=False|True|False|True"
sed -n '/^step overlap-512k/,$p' bench/device/call_ai.sh > /tmp/call_ai_steps.sh
source /tmp/call_ai_steps.sh
