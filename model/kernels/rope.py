"""RoPE in one launch: the torch form (`model/rope.py: apply_rope`) is six small kernels per
call, three calls per attention layer, a third of a decode step's launches at batch 1.

Shapes: n rows, h heads (any leading dims after the first, flattened), D channels of which
the last 2*half rotate. Each pair (e, o) becomes (e*cos - o*sin, o*cos + e*sin), or with -sin
for the inverse, rounded as the torch form rounds: two products, then their sum. On the GPU
the products are PTX `mul.rn`, which the compiler cannot fuse with the sum into an FMA (that
would round once, not three times); the interpreter computes in numpy, which never fuses.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .common import interpreting

_PTX = tl.constexpr(not interpreting())
IN_PLACE = True  # off: `overwrite` is ignored (bench/prefill_passes.py times both in one process)


@triton.jit
def mul_rn(a, b, PTX: tl.constexpr):
    """a * b rounded on its own: never contracted with a following add into an FMA."""
    if PTX:
        out = tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                        is_pure=True, pack=1)
    else:
        out = a * b
    return out


@triton.jit
def rope_values(row_ptr, d, cos_row, sin_row, live, D: tl.constexpr, HALF: tl.constexpr, INVERSE: tl.constexpr,
                PTX: tl.constexpr):
    """Channels d (where live) of the row at row_ptr after RoPE, fp32: the last 2*HALF rotate
    in pairs with the row's angles at cos_row / sin_row, the others are as they were. Forward
    e' = e*c - o*s, o' = o*c + e*s; inverse: the signs of the sin terms flip."""
    x = tl.load(row_ptr + d, mask=live, other=0.0).to(tl.float32)
    r = d - (D - 2 * HALF)  # index inside the rotated channels (negative: not rotated)
    rotates = live & (r >= 0)
    partner = tl.load(row_ptr + (d ^ 1), mask=rotates, other=0.0).to(tl.float32)  # D - 2*HALF is even
    i = tl.where(rotates, r // 2, 0)
    c = tl.load(cos_row + i, mask=rotates, other=1.0)
    s = tl.load(sin_row + i, mask=rotates, other=0.0)
    sign = tl.where(((r % 2) == 0) == INVERSE, 1.0, -1.0)
    return tl.where(rotates, mul_rn(x, c, PTX) + mul_rn(partner, s, PTX) * sign, x)


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, o_ptr, n, H, sxn, sxh, son, soh, scn,
                 D: tl.constexpr, HALF: tl.constexpr, FIRST: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_H: tl.constexpr, INVERSE: tl.constexpr, PTX: tl.constexpr, FLAT: tl.constexpr,
                 PDL: tl.constexpr):
    """Program (row, BLOCK_H heads) over channels FIRST..D-1: those before D - 2*HALF are
    copied, the rest rotate in pairs. FIRST = D - 2*HALF writes the rotated channels alone (in
    place: each program loads a pair's both channels before it stores them). FLAT (the
    interpreter): program p takes the BLOCK_H (row, head) pairs from p * BLOCK_H on, row-major."""
    pdl.wait_for_inputs(PDL)
    if FLAT:
        pair = (tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H))[:, None]
        row, head = pair // H, pair % H
        in_range = pair < n * H
    else:
        row = tl.program_id(0)
        head = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H))[:, None]
        in_range = head < H
    d = FIRST + tl.arange(0, BLOCK_D)[None, :]
    live = (d < D) & in_range
    angles = row.to(tl.int64) * scn
    out = rope_values(x_ptr + row.to(tl.int64) * sxn + head * sxh, d, cos_ptr + angles, sin_ptr + angles, live,
                      D, HALF, INVERSE, PTX)
    tl.store(o_ptr + row.to(tl.int64) * son + head * soh + d, out.to(o_ptr.dtype.element_ty), mask=live)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False,
         overwrite: bool = False) -> torch.Tensor:
    """apply_rope(x, cos, sin, inverse) in one launch: x [n, ..., D], cos/sin [n, half] fp32.
    overwrite: x is a temporary, rotated in place, and only its rotated channels are read and
    written (a prefill chunk's attention output: 1 GB fp32, of which 1/8 rotates)."""
    n, D, half = x.shape[0], x.shape[-1], cos.shape[-1]
    assert cos.shape == sin.shape == (n, half) and 2 * half <= D and D % 2 == 0
    flat = x.reshape(n, -1, D)
    in_place = overwrite and IN_PLACE and flat.stride(-1) == 1 and flat.data_ptr() == x.data_ptr()
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    out = flat if in_place else torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    if out.numel() and half:
        heads = flat.shape[1]
        first = D - 2 * half if in_place else 0
        # one head a program on the GPU (8 when only the rotated channels are written); in the
        # interpreter, which runs each program in Python, 256 (row, head) pairs of any rows
        if interpreting():
            block_h = 256
            grid = (triton.cdiv(n * heads, block_h),)
        else:
            block_h = min(8, triton.next_power_of_2(heads)) if in_place else 1
            grid = (n, triton.cdiv(heads, block_h))
        _rope_kernel[grid](flat, cos, sin, out, n, heads, flat.stride(0), flat.stride(1), out.stride(0), out.stride(1),
                           cos.stride(0), D=D, HALF=half, FIRST=first, BLOCK_D=triton.next_power_of_2(D - first),
                           BLOCK_H=block_h, INVERSE=inverse, PTX=_PTX, FLAT=interpreting(), **pdl.options(flat.device))
    elif out.numel() and not in_place:
        out.copy_(flat)
    return out.view(x.shape)
