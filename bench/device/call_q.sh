# Device call Q (~450 s, an H200: the weights kept need more than an H100's 80 GB): the 1M
# faithful prefill with the mHC mixes' raw heads and the one-pass sites (common.RAW_HEADS,
# hc_streams.SITE_ROWS, fiftieth session) against both off, alternated in one process in the
# best set-up so far (32K chunks, every weight kept: 44.84 s in the forty-ninth session), then
# with the shipped defaults (16K chunks, nothing kept: 46.65 s in the forty-eighth). First the
# GPU tests of the shared expert's output added in the pair sums (pair_sums(plus=...)).
source bench/device/env.sh
step gpu-tests 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/model/test_kernels.py \
  tests/model/test_prefill_gemms.py -k "pair_sums or shared_expert or other_ranks"
grep -q "=== gpu-tests rc=0 " "$LOG" || exit 1
step kept32k-ab 330 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 80e9 --budget-s 600 \
  --prefill-switch "dsflash.model.kernels.common.RAW_HEADS=True|False;dsflash.model.kernels.hc_streams.SITE_ROWS=4096|0"
step shipped-1m 160 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 --budget-s 200
