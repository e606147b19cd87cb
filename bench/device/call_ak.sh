# Device call AK (~560 s, any card; its parts in the order they matter).
# 1. The GPU tests of the bf16 streams, fn's bf16 parts and the NaN-keeping store.
# 2. The shipped fp32 sites at 16K rows in their tiles (bench/prefill_passes.py --sections
#    sites), 16 tokens a program among them: sm_90 94 registers without the expand (five
#    programs an SM), 168 with it (three), where the fiftieth session's tiles stopped at 32
#    tokens (255). A token's results do not depend on the others' in any tile, so a faster
#    tile keeps the exactness properties: shippable as SITE_TILES.
# 3. The one-pass sites on bf16 streams (layers/mhc.BF16_STREAMS), their mixes as bf16 MMAs
#    against fn's three bf16 parts (hc_streams.BF16_DOTS, PARTS_TILES: a step 1,233 -> 715
#    SASS instructions a thread) in a few tiles, and with the expand split out (SPLIT_EXPAND).
# 4. A 256K faithful prefill in 16K chunks alternated in one process: fp32 streams, bf16
#    streams, with the bf16 dots, and with the expand split out, twice each (the forms' last
#    logits differ by design). Whatever they gain, bf16 streams do not ship as they are: they
#    break the exactness properties on the tiny checkpoint (layers/mhc.BF16_STREAMS' comment).
source bench/device/env.sh
step gpu-tests-streams 90 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_bf16_streams.py
step sites-16k 120 python3 bench/prefill_passes.py --rows 16384 --sections sites --budget-s 110
step bf16-sites 100 python3 bench/prefill_passes.py --rows 16384 --sections bf16 --budget-s 90
step dots-256k 240 python3 bench/h200.py --sections prefill --act-quant --prefill 262144 --chunk 16384 \
  --budget-s 600 --prefill-switch "dsflash.model.layers.mhc.BF16_STREAMS=False|True|True|True|False|True|True|True;\
dsflash.model.kernels.hc_streams.BF16_DOTS=False|False|True|True|False|False|True|True;\
dsflash.model.kernels.hc_streams.SPLIT_EXPAND=False|False|False|True|False|False|False|True"
