"""Sparse attention at decode sizes (6-96 queries of the release's shapes, 128 window keys and
512 entries each): the decode form (flash decoding on TF32 dots), the tensor-core form with one
program per query, and the tensor-core form with each query's keys split over 4, 7, 10 or 20
programs (DECODE_KEY_SPLITS), each in a CUDA graph, with its difference from the decode form.

    python bench/decode_attention_splits.py
"""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels.sparse_attention import sparse_attention  # noqa: E402

dev = "cuda"
heads, D, W, K, rows = 64, 512, 128, 512, 1 << 16
ring, pages = h200.key_bytes(rows, D, dev)
for n in (6, 12, 24, 48, 96):
    q = torch.randn(n, heads, D, device=dev)
    w_off = torch.randint(0, rows, (n, W), device=dev) * D
    w_off[:, :3] = -1  # a few masked keys of each kind
    w_soff = rows * D + torch.randint(0, rows, (n, W), device=dev) * (D // 32)
    e_off = torch.randint(0, rows, (n, K), device=dev) * 256
    e_off[:, -5:] = -1
    e_soff = rows * 256 + torch.randint(0, rows, (n, K), device=dev) * 32
    args = (q, ring, w_off, w_soff, pages, e_off, e_soff, torch.zeros(heads, device=dev), D**-0.5)
    ref = sparse_attention(*args, prefill=False)
    forms = {"decode form": dict(prefill=False), "one program a query": dict(prefill=True, entry_splits=0)}
    forms.update({f"{s} splits": dict(prefill=True, entry_splits=s) for s in (4, 7, 10, 20)})
    line = []
    for name, kw in forms.items():
        t = h200.graph_time(lambda: sparse_attention(*args, **kw))
        diff = ((sparse_attention(*args, **kw) - ref).abs().max() / ref.abs().max()).item()
        line.append(f"{name} {t * 1e6:.1f} us ({diff:.0e})")
    print(f"[attention] {n} queries: " + " | ".join(line), flush=True)
