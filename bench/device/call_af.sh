# Device call AF (~250 s, any card): where a faithful prefill chunk leaves the GPU idle. 32K
# -> 64K chunks saved ~1.9 s of the 1M prefill (fiftieth session), ~120 ms a chunk fewer, more
# than the experts' weight encode a chunk (~25 ms): if the rest is the GPU waiting on the
# host (syncs, launches), a prefill chunk could lose it whatever its size. A 128K prompt in
# 16K and in 32K chunks, its last chunk profiled (the GPU's busy time against the unprofiled
# chunk before it, the idle time before each kind of work) and a second chunk with Python
# stacks (bench/h200.py --profile; programmatic dependent launch off in these runs).
source bench/device/env.sh
step gaps-16k 170 python3 bench/h200.py --sections prefill --act-quant --prefill 131072 --chunk 16384 \
  --profile --budget-s 300
step gaps-32k 170 python3 bench/h200.py --sections prefill --act-quant --prefill 131072 --chunk 32768 \
  --profile --budget-s 300
