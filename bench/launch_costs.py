"""What one eager call costs the host, next to its GPU time: a bare Triton launch, a torch op,
and the fast path's ops a compressor/indexer layer runs eagerly at decode (6 rows).

A decode step's eager parts are host-bound (bench/decode_timeline.py): the GPU waits for
launches. Each case runs back to back without a sync (host us per call), then once between
syncs inside a CUDA graph of 20 calls (GPU us per call).

    python bench/launch_costs.py [--preset small] [--rows 6]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def host_us(fn, calls: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - began) / calls
    torch.cuda.synchronize()
    return host * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--rows", type=int, default=6)
    args = parser.parse_args()
    h200.DEADLINE[0] = time.monotonic() + 3600
    model, _ = h200.build_model(fast=True, preset=args.preset)
    ops, c = model.ops, model.config
    source = next(role for role in c.roles if role.is_kv_source)
    p, dev, n = source.prefix, "cuda", args.rows
    x = torch.randn(n, c.hidden_size, device=dev)
    y = torch.empty_like(x)
    latent = torch.randn(n, c.head_dim, device=dev)
    positions = torch.arange(1000, 1000 + n, device=dev)
    cos, sin = model.rope.cos_sin("yarn", positions)
    norm = ops.w(f"{p}.attn_norm.weight")
    cases = {
        "torch x.add_(0) (one kernel)": lambda: x.add_(0.0),
        "bare Triton launch (2 pointers, one int)": lambda: _copy_kernel[(1,)](x, y, x.numel(), BLOCK=1024),
        "ops.rms_norm (one Triton launch)": lambda: ops.rms_norm(x, norm, c.rms_norm_eps),
        "ops.linear, compressor wkv (FP8 GEMM)": lambda: ops.linear(x, f"{p}.attn.compressor.wkv.weight"),
        "rope.cos_sin (3 torch ops)": lambda: model.rope.cos_sin("yarn", positions),
        "ops.norm_rope_fp4 (one Triton launch)": lambda: ops.norm_rope_fp4(latent, cos, sin, 16, e4m3_scales=True),
        "torch.arange on the device": lambda: torch.arange(n, device=dev),
        "to_device of a 3x6 host tensor": lambda: torch.tensor([[1] * n] * 3).to(dev, non_blocking=True),
    }
    print(f"{'host us':>8} | {'GPU us':>8} | call ({n} rows, preset {args.preset})")
    for name, fn in cases.items():
        host = host_us(fn)
        gpu = float("nan")
        try:
            gpu = h200.graph_time(fn) * 1e6
        except Exception:  # a host copy cannot be captured
            pass
        print(f"{host:8.1f} | {gpu:8.1f} | {name}", flush=True)


if __name__ == "__main__":
    main()
