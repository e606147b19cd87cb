# Device call AH (~170 s, any card): how much of a late 1M chunk's index top-k runs beside the
# scores. At 128K (call AF, H100) a 16K chunk's GPU work summed to 598.1 ms and its union to
# 594.3: of the top-k's ~17 ms on its side stream, ~4 ms overlapped anything. A late 1M
# chunk's top-k takes ~88 ms (forty-third session); what of it overlaps is what a fused or a
# co-resident form could win. The 1M faithful prefill in the shipped set-up (16K chunks), its
# last chunk profiled (gpu_work_ms against gpu_busy_ms; bench/h200.py --profile).
source bench/device/env.sh
step gaps-1m 230 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --profile --budget-s 400
