"""Faithful prefill's attention over decoded keys (the Gluon rows kernel) at a 16K chunk's
shape, its queries rotated two ways: by attention_queries.query_parts' launch into a bf16 copy
first (as shipped), and inside the kernel as it reads the fp32 queries
(sparse_attention.ROPE_IN_ROWS). Alternated in one process, each next to the queries' bytes
at the measured HBM rate; the outputs compared bit for bit.

    python bench/rope_in_rows.py [--queries 16384]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import sparse_attention as sa  # noqa: E402
from dsflash.model.kernels.attention_queries import Queries  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--queries", type=int, default=16384)
args = parser.parse_args()
n, heads, D, half, W, K, keys = args.queries, 64, 512, 32, 128, 512, 1 << 16
g = torch.Generator(device="cuda").manual_seed(0)
raw = torch.randn(n, heads, D, device="cuda", generator=g) * 0.5
angles = torch.rand(n, half, device="cuda", generator=g) * 100
cos, sin = angles.cos(), angles.sin()
window_keys = (torch.randn(keys, D, device="cuda", generator=g) * 0.1).bfloat16()
entry_keys = (torch.randn(keys, D, device="cuda", generator=g) * 0.1).bfloat16()
window_rows = torch.randint(0, keys, (n, W), device="cuda", generator=g)
entry_rows = torch.randint(0, keys, (n, K), device="cuda", generator=g)
sink = torch.randn(heads, device="cuda", generator=g)
q = Queries(raw, cos, sin, True)


def attend():
    return sa.attend_decoded(q, window_keys, window_rows, entry_keys, entry_rows, sink, D**-0.5)


hbm = h200.HBM_BPS
times, outs = {False: [], True: []}, {}
for _ in range(3):
    for on in (False, True):
        sa.ROPE_IN_ROWS = on
        outs[on] = attend()
        times[on].append(h200.cuda_time(attend, iters=10))
q_bytes = raw.numel() * 4
for on in (False, True):
    best = min(times[on])
    label = "rotated_in_kernel" if on else "query_parts_first"
    h200.record("rope_in_rows", f"n{n}_{label}", {"us": best * 1e6, "fp32_queries_read_us": q_bytes / hbm * 1e6})
print(f"[rope_in_rows] {n} queries x {heads} heads: query_parts first {min(times[False]) * 1e6:.0f} us, "
      f"rotated in the kernel {min(times[True]) * 1e6:.0f} us (runs {[round(t * 1e6) for t in times[False]]} / "
      f"{[round(t * 1e6) for t in times[True]]}); the fp32 queries' one read {q_bytes / hbm * 1e6:.0f} us; "
      f"same bits: {torch.equal(outs[False], outs[True])}", flush=True)
