# Device call R (~140 s, an H200): the 1M faithful prefill in 64K chunks (fiftieth session),
# nothing kept (peak 97 GiB), then with 37 GiB of weights kept (peak 132 GiB: only with the
# allocator's segments expandable; 25e9 without them ran out of memory, 28.6 GiB reserved
# but unallocated).
source bench/device/env.sh
step chunk64k 260 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 65536 \
  --weight-cache-bytes 0 --budget-s 400
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
step chunk64k-kept 200 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 65536 \
  --weight-cache-bytes 40e9 --budget-s 400
