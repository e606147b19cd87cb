"""The prefill form of sparse attention at 8,192 queries of the release's shapes: pipeline
depth (num_stages), key tile, the two-pass form and one bf16 part, against the shipped tiles
(PREFILL_TILES), alternated, each with its FLOP rate (the bf16 limit is 694 TFLOP/s).

    python bench/prefill_attention_stages.py
"""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels.sparse_attention import sparse_attention  # noqa: E402

dev = "cuda"
heads, D, W, K, n = 64, 512, 128, 512, 8192
rows = 1 << 16
ring, pages = h200.key_bytes(rows, D, dev)
q = torch.randn(n, heads, D, device=dev)
# neighbouring queries share their window (as in a prompt) and draw entries from a nearby range
base = torch.arange(n, device=dev)[:, None]
w_off = ((base + torch.arange(W, device=dev)[None, :]) % rows) * D
w_soff = rows * D + ((base + torch.arange(W, device=dev)[None, :]) % rows) * (D // 32)
pick = torch.randint(0, 4096, (n, K), device=dev)
e_off, e_soff = pick * 256, rows * 256 + pick * 32
sink = torch.zeros(heads, device=dev)
args = (q, ring, w_off, w_soff, pages, e_off, e_soff, sink, D**-0.5)
ref = sparse_attention(*args, prefill=True)
flops = 4 * n * heads * (W + K) * D


def timed(tiles):
    seconds = h200.cuda_time(lambda: sparse_attention(*args, prefill=True, tiles=tiles), iters=5, warmup=2)
    out = sparse_attention(*args, prefill=True, tiles=tiles)
    return seconds * 1e3, ((out - ref).abs().max() / ref.abs().max()).item()


# the shipped form is two-pass (the logits once per query, then the weighted sums; eighth
# session); the one-pass form, pipeline depths and key tiles, and both forms in one bf16 part
# (faithful mode: its queries are bf16, and take the one-pass form); BOTH (fifteenth session,
# not yet timed): one program for both column halves, each logit once, on 8 warps or 4
variants = [dict(), dict(TWO_PASS=0), dict(num_stages=3), dict(KT2=32), dict(KT2=16),
            dict(QP=1, PP=1), dict(TWO_PASS=0, QP=1, PP=1),
            dict(TWO_PASS=0, QP=1, PP=1, BOTH=1, num_warps=8), dict(TWO_PASS=0, QP=1, PP=1, BOTH=1),
            dict(TWO_PASS=0, BOTH=1, num_warps=8)]
for round_ in range(2):
    for v in variants:
        try:
            ms, diff = timed(v)
            print(f"[attn] round {round_} {v or 'shipped'}: {ms:.2f} ms ({flops / ms / 1e9:.0f} TFLOP/s), max rel diff {diff:.1e}", flush=True)
        except Exception as exc:
            print(f"[attn] {v}: {type(exc).__name__}: {str(exc)[:150]}", flush=True)
