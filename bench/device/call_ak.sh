# Device call AK (~500 s, any card): faithful mode's bf16 streams (layers/mhc.BF16_STREAMS) with
# the prefill sites' mixes as bf16 MMAs against fn's three bf16 parts (hc_streams.BF16_DOTS,
# PARTS_TILES: each site step 1,233 -> 715 SASS instructions a thread, the attention site at
# four programs an SM; the sites are latency-bound, so this may or may not shorten them).
# First the GPU tests (the bf16 streams and parts, the NaN-keeping store); then the one-pass
# sites at 16K rows on fp32 and bf16 streams and with the bf16 dots in a few tiles
# (bench/prefill_passes.py --sections bf16); then a 256K faithful prefill in 16K chunks
# alternated in one process: fp32 streams, bf16 streams, bf16 streams with the bf16 dots, and
# with the FFN sites' expand split out (hc_streams.SPLIT_EXPAND), twice each (fp32 and bf16
# streams' last logits differ by design; the bf16 forms' dots differ in their last bits, so
# their logits may too). Whatever they gain, bf16 streams do not ship as they are: they break
# the exactness properties on the tiny checkpoint (layers/mhc.BF16_STREAMS' comment).
source bench/device/env.sh
step gpu-tests-streams 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_bf16_streams.py
step bf16-sites 120 python3 bench/prefill_passes.py --rows 16384 --sections bf16 --budget-s 110
step dots-256k 260 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --budget-s 600 --prefill-switch "dsflash.model.layers.mhc.BF16_STREAMS=False|True|True|True|False|True|True|True;\
dsflash.model.kernels.hc_streams.BF16_DOTS=False|False|True|True|False|False|True|True;\
dsflash.model.kernels.hc_streams.SPLIT_EXPAND=False|False|False|True|False|False|False|True"
