# Device call BH (~130 s, an H200, needs_h200; sixtieth session): the 1M faithful prefill with the
# shipped defaults alone (16K chunks, nothing kept: 44.28 s in the fifty-first session), a
# process's first run, for the budget's last minutes; call BG's last step.
source bench/device/env.sh
step shipped-1m 125 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
