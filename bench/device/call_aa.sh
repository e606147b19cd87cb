# Device call AA (~120 s, any card): where an early faithful chunk goes now (the fifty-second
# session: SHARED_EXPERT_OPERAND and SITE_OPERAND on), the second 16,384-token chunk of a 32K
# prompt profiled with its stacks (bench/h200.py --profile), after a timed 32K prefill.
source bench/device/env.sh
step prefill-32k-profile 200 python3 bench/h200.py --sections prefill --act-quant --prefill 32768 --chunk 16384 \
  --profile --budget-s 300
