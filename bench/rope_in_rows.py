"""Faithful prefill's attention over decoded keys (the Gluon rows kernel) at a 16K chunk's
shape, from the queries before RoPE to wo_a's FP8 operand, three ways:
- query_parts_first: attention_queries.query_parts rotates the queries into a bf16 copy, the
  kernel writes fp32 outputs, the inverse RoPE's launch and rows_1x128 make the operand;
- rotated_in_kernel: the kernel rotates the fp32 queries as it reads them
  (sparse_attention.ROPE_IN_ROWS), then as the first;
- encoded_in_kernel: the kernel also writes the operand itself (sparse_attention.ENCODE_IN_ROWS).
Alternated in one process, each next to the fp32 queries' and outputs' bytes at the measured
HBM rate; the operands compared bit for bit.

    python bench/rope_in_rows.py [--queries 16384]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp8_blockwise  # noqa: E402
from dsflash.model.kernels import sparse_attention as sa  # noqa: E402
from dsflash.model.kernels.attention_queries import Queries  # noqa: E402
from dsflash.model.kernels.rope import rope  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--queries", type=int, default=16384)
args = parser.parse_args()
n, heads, D, half, W, K, keys, groups = args.queries, 64, 512, 32, 128, 512, 1 << 16, 8
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
FORMS = {"query_parts_first": (False, False), "rotated_in_kernel": (True, False), "encoded_in_kernel": (True, True)}


def operand():
    """wo_a's operand of the attention's outputs, as attention_kernel.attend_updated and
    grouped_fp8_gemm make it under the switches set."""
    o = sa.attend_decoded(q, window_keys, window_rows, entry_keys, entry_rows, sink, D**-0.5, groups)
    if isinstance(o, fp8_blockwise.Operand):
        return o.codes[:, :n], o.scales.view(heads * D // 128, -1)[:, :n]
    codes, scales = fp8_blockwise.rows_1x128(rope(o, cos, sin, inverse=True, overwrite=True).view(n, -1), groups,
                                             round_first=True)
    return codes[:, :n], scales.view(heads * D // 128, -1)[:, :n]


times, outs = {form: [] for form in FORMS}, {}
for _ in range(3):
    for form, (rotate, encode) in FORMS.items():
        sa.ROPE_IN_ROWS, sa.ENCODE_IN_ROWS = rotate, encode
        outs[form] = operand()
        times[form].append(h200.cuda_time(operand, iters=10))
fp32_bytes = raw.numel() * 4  # the queries' one read, and the outputs' one write
same = all(torch.equal(a, b) for form in FORMS if form != "query_parts_first"
           for a, b in zip(outs[form], outs["query_parts_first"]))
for form in FORMS:
    h200.record("rope_in_rows", f"n{n}_{form}", {"us": min(times[form]) * 1e6,
                                                  "fp32_rows_once_us_at_4.2TBps": fp32_bytes / h200.HBM_BPS * 1e6})
print(f"[rope_in_rows] {n} queries x {heads} heads to wo_a's operand: "
      + ", ".join(f"{form} {min(times[form]) * 1e6:.0f} us {[round(t * 1e6) for t in times[form]]}" for form in FORMS)
      + f"; fp32 [n, {heads}, {D}] read or written once {fp32_bytes / h200.HBM_BPS * 1e6:.0f} us at the H200's "
      f"{h200.HBM_BPS / 1e12:.1f} TB/s; same bits: {same}",
      flush=True)
