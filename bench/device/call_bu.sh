# Device call BU (~420 s on an H200 with a Triton kit, needs_h200; sixty-seventh session): the
# 1M headline and the newest kernels' GPU tests on an H200, where none has run since the
# fifty-first session: BR (the 1M in 32K chunks with every weight kept, 1 | 2 | 1 | 2 streams),
# then BV (the GPU tests of the files changed since). Carry .triton-kit beside .bench, .whl and
# dsflash/v1. On an H100 it runs the same (BR's 16K form).
source bench/device/call_br.sh
source bench/device/call_bv.sh
