# Device call L (~420 s, an H200: the weights kept need more than an H100's 80 GB): the 1M
# faithful prefill as a prefill worker on one H200 could be set up, against the shipped
# defaults' 46.65 s (16K chunks, nothing kept; forty-eighth session): 32K chunks
# (`--prefill-token-budget 32768`), and every weight kept encoded (`--weight-cache-bytes`: the
# bench preset's ~69 GiB of re-encoded weights; 37.3 GiB kept gave 45.05 s), each alone and
# together (forty-ninth session).
source bench/device/env.sh
step chunk32k 260 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 32768 \
  --weight-cache-bytes 0,80e9 --budget-s 400
step chunk16k-kept 150 python3 bench/h200.py --sections prefill --act-quant --prefill 1048576 --chunk 16384 \
  --weight-cache-bytes 80e9 --budget-s 200
