# Sourced first by every device call: the carried wheels, the source tree as the package, and
# the clock the GPU runs at (lent machines differ by up to ~25% on the same code).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DSFLASH_GOLDEN=$PWD/.bench/golden \
  DSFLASH_TOKENIZER=$PWD/.bench/golden/v41-tiny-a/tokenizer.json
for d in model kvcache prefill_worker decode_worker gateway; do ln -sfn "../$d" "dsflash/$d"; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv
LOG=${OUT:-/tmp}/log.txt
# step NAME SECONDS CMD...: one part under its own limit, its output in the log and its files
# (bench/h200.py's h200.json) under $OUT/NAME, and go on. (bench/h200.py starts a prefill run
# only where its --budget-s leaves room for it, 90 s for the first, by the last run's time for
# later ones: the calls give it more than the step's limit, which is the one that holds.)
step() { local name=$1 limit=$2; shift 2; echo "=== $name ($(date -u +%T))" | tee -a "$LOG";
         OUT="${OUT:-/tmp}/$name" timeout "$limit" "$@" 2>&1 | tee -a "$LOG"; echo "=== $name rc=$? " | tee -a "$LOG"; }
