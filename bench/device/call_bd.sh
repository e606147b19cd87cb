# Device call BD (~560 s, an H200, needs_h200; fifty-ninth session): call AL's 1M faithful
# prefills, each a process's first (32K chunks with every weight kept, compile-logged; 48K
# chunks kept; the shipped 16K chunks, nothing kept), then call BC's first step: what the
# attention's queries cost in bytes at a 16K chunk (bench/query_bytes.py).
source bench/device/call_al.sh
step query-bytes 130 python3 bench/query_bytes.py
