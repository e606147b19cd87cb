# Sourced first by every device call: the carried wheels, the source tree as the package, and
# the clock the GPU runs at (lent machines differ by up to ~25% on the same code).
# Once a call: a call that sources others (BU: BR, then BV) sets all this up once.
[ -n "$DSFLASH_DEVICE_ENV" ] && return 0
DSFLASH_DEVICE_ENV=1  # not exported: a child shell sets up its own
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DSFLASH_GOLDEN=$PWD/.bench/golden \
  DSFLASH_TOKENIZER=$PWD/.bench/golden/v41-tiny-a/tokenizer.json
for d in model kvcache prefill_worker decode_worker gateway; do ln -sfn "../$d" "dsflash/$d"; done
# Kernels compiled on an earlier machine (bench/device/triton_kit.py; carry .triton-kit):
# loaded, not compiled again; at the call's end this machine's cache goes back in $OUT/triton-kit.
export TRITON_CACHE_DIR=/tmp/triton-cache
[ -d .triton-kit ] && python3 bench/device/triton_kit.py unpack .triton-kit "$TRITON_CACHE_DIR"
trap 'python3 bench/device/triton_kit.py pack "$TRITON_CACHE_DIR" "${OUT:-/tmp}/triton-kit"' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv
LOG=${OUT:-/tmp}/log.txt
# step NAME SECONDS CMD...: one part under its own limit, its output in the log and its files
# (bench/h200.py's h200.json) under $OUT/NAME, and go on. (bench/h200.py starts a prefill run
# only where its --budget-s leaves room for it, 90 s for the first, by the last run's time for
# later ones: the calls give it more than the step's limit, which is the one that holds.)
step() { local name=$1 limit=$2; shift 2; echo "=== $name ($(date -u +%T))" | tee -a "$LOG";
         OUT="${OUT:-/tmp}/$name" timeout "$limit" "$@" 2>&1 | tee -a "$LOG"; echo "=== $name rc=$? " | tee -a "$LOG"; }
# Calls BR and CF: the 1M headline's set-up by card, an H200's 32K chunks with every weight kept,
# an H100's shipped 16K chunks (its 80 GB cannot hold the weights kept).
CHUNK=16384
KEEP=0
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then CHUNK=32768; KEEP=80e9; fi
# Calls AC and AE: the fifty-second session's three prefill switches, on | off.
THREE_SWITCHES="dsflash.model.kernels.prefill_gemms.SHARED_EXPERT_OPERAND=True|False;dsflash.model.kernels.hc_streams.SITE_OPERAND=True|False;dsflash.model.kernels.hc_streams.UNREAD_INPUT_LEFT=True|False"
# gluon_checked: the Gluon score tiles' GPU test; where it passed, the score tiles timed alone
# (bench/h200.py --sections indexer_fp8) and QB, NB set to the tile (queries, entries) in which
# the Gluon form ran fastest at 128 x 1M while equal to the Triton tiles' scores (64, 128 if
# none did). Fails where the test did.
gluon_checked() {
  step gpu-tests 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py -k "gluon_tall_tiles"
  grep -q "=== gpu-tests rc=0 " "$LOG" || return 1
  step indexer-fp8 120 python3 bench/h200.py --sections indexer_fp8
  read -r QB NB <<< "$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1])).get("kernel_indexer_prefill", {})
tiles = [(f["us"], k.split("_")[-1].split("x")) for k, f in r.items()
         if k.startswith("N1048576_n128_fp8_tall_encoded_gluon_") and f.get("equal_to_fp8_tall_encoded")]
print(*min(tiles, default=(0, (64, 128)))[1])
' "${OUT:-/tmp}/indexer-fp8/h200.json" 2>/dev/null || echo 64 128)"
  echo "gluon tile: $QB x $NB" | tee -a "$LOG"
}
# After a step that ran tests/tiers/test_gpu_worker.py with --basetemp $OUT/worker-tmp (calls
# AX-BB): each kernel_compiled_while_serving line by the log it came from (prefill-PORT.log,
# decode-PORT.log, serve.log), the warm-ups' times, then the workers' logs dropped.
worker_compiles_report() {
  grep -r "kernel_compiled_while_serving" "${OUT:-/tmp}/worker-tmp" 2>/dev/null \
    | sed -E 's#^.*/([^/]+\.log):.*kernel_compiled#\1 kernel_compiled#' | sort | tee -a "$LOG" "${OUT:-/tmp}/worker-compiles.txt"
  grep -rh "prefill_warm_up\|warmed up" "${OUT:-/tmp}/worker-tmp" 2>/dev/null | cut -c1-300 | tee -a "$LOG"
  rm -rf "${OUT:-/tmp}/worker-tmp"
}
