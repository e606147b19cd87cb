# Device call N (~100 s, any card): the forty-ninth session's GPU test shape of the prefill
# top-k's filtered form (2,048 x 32,769, never run on a GPU), then where an mHC site's mixes
# launch spends its time (bench/mixes_parts.py: its loop with the dots left out, with one TF32
# dot and with the fp32-accurate ones, per tile shape, next to hc_mixes), fiftieth session.
source bench/device/env.sh
step top-k-gpu 240 python3 -m pytest -q -p no:cacheprovider -k large_shapes tests/model/test_top_k_kernel.py
step mixes-parts 300 python3 bench/mixes_parts.py --rows 16384 \
  --shapes "128,32,8,3,4;128,64,8,3,4;64,64,4,3,4;64,32,4,3,4;128,32,8,4,4;256,32,8,3,4;128,32,4,3,4"
