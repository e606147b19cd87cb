"""Faithful mode's decode experts on the FP8 tensor cores: a measured spike, not a shipped path.

Why: at batch 1 the routed experts are the largest part of a decode step (8.07 of 20.74 ms of
kernels, thirty-fifth session), and they are bound by decoding the FP4 codes, not by reading
them (bench/moe_floor.py, H200: reading 130 us a layer, reading and decoding 214-231, the
shipped kernels 226-241; the bytes 125). The shipped decode turns codes into bf16 (11 integer
instructions and 4 multiplies per 8 codes, ~3.2 SASS instructions a code in all), because
exact mode needs bf16 products of three activation parts. Faithful mode's activations are on
the FP8 grid already (e4m3 codes, an e8m0 scale per 32), so both operands can be e4m3:

- an e2m1 code s|e1 e0 m, moved to bits 7 and 4..2 of a byte, is the e4m3 code of its value
  times 2^-6 (e2m1's subnormal 0.5 lands on e4m3's subnormal 2^-7): no table, no multiply;
- with a byte holding codes j and j + 32 of a 64-code group (rearranged once at load), one
  32-bit word decodes into the e4m3 codes of two 32-column blocks in 7 instructions
  (shift/and/or; 0.9 a code), each block a K = 32 FP8 MMA of its own; with the codes' bits
  placed for it too (split_bits), in 5;
- the blocks' scales (the weight row's and the pair's, per 32 columns) cannot wait for the end
  of K, and a multiply-add after every MMA costs as much as the decode. But a decode block holds
  2-4 pairs and the dot has 16 columns (its least for 8-bit operands): the spare columns carry
  the blocks apart. Column j is pair j // KB and block j % KB of a chunk of KB = 16 / pairs
  blocks; each block's MMA sees activations in its own columns only (zeros elsewhere), so one
  accumulator keeps the chunk's blocks apart and the scales apply once a chunk (8 or 4 times
  fewer multiply-adds), the MMAs doing 8 or 4 times the needed work (cheap at decode).
  "gathered": the kernel loads each block's activations under a column mask; "laid out": it
  reads them as expand_columns lays them out (built by torch here, outside the timed launches:
  a producer would write that form, the input's FP8 rounding or the gate/up epilogue).

--dots f16 runs the same kernel's dots in f16 on mma.sync instead (the e4m3 codes converted
to f16, which holds every e4m3 value, so the products and sums are fp32's as the shipped
kernels' are; and mma.sync takes its operands from registers, where Triton takes the FP8
wgmmas' decoded operand through shared memory and waits on it. In f16 on wgmma the loop
compiles to 943 SASS instructions for 256 codes, 224 of them PRMT layout shuffles: not timed).

What it gives up: the FP8 MMA sums a block's 32 products in the tensor core (Hopper keeps ~14
bits there, DeepSeek-V3's report) where the shipped kernel's fp32 sums are exact; faithful
prefill's cuBLAS products already do so, over 128 columns.

This times, on random experts of the bench preset's widths, the shipped faithful fp4_moe (route
plan, gate/up with SwiGLU, down, pair sums) against the FP8 form's two products (gate/up rows
and down rows; no SwiGLU, no pair sums: both negligible at decode), each in a CUDA graph, next
to the touched experts' bytes at the H200's 4.2 TB/s, and checks the FP8 products against
float64 ones of the same values.

H100, 2026-12-07 (sixty-eighth session, docs/bench/h100-2026-12-07-sixtyeighth-call-bx.txt):
slower than the shipped kernels. 6 tokens: shipped 229 us, this 250 at best (2-pair blocks, 128
rows, 4 warps, gathered; the bit layout 251; laid out 264; 4-pair blocks 283-316); 12 tokens:
295 against 360. Sums 4.5-5.4e-5 of the largest from float64. Each wgmma waits on its decoded
operand's trip through shared memory, eight a chunk (the shipped bf16 kernels' wgmmas take
their decoded operand from registers); Triton's mma.sync for FP8 converts to f16. (Call BX also
ran a decode floor, int32 words with loads not pipelined: it took longer than the whole kernel,
so it was no floor, and it is gone.)
With --dots f16 (another H100, call BZ): 236 against the shipped 224 us at 6 tokens, 326
against 286 at 12, sums 1.2-1.9e-7 of the largest from float64.

    python bench/moe_fp8_dots.py [--tokens 6,12]
"""
import argparse
import itertools
import pathlib
import sys
from collections.abc import Callable, Iterator

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp4_moe as moe  # noqa: E402
from dsflash.model.kernels.common import mma_sync, pow2  # noqa: E402
from dsflash.model.quant import dequantize_fp4_weight  # noqa: E402

GROUP = 64  # codes a rearranged group: byte j holds codes j (low nibble) and j + 32 (high)


def split_groups(packed: torch.Tensor) -> torch.Tensor:
    """Checkpoint bytes [..., K/2] (codes 2b and 2b + 1 in byte b, low nibble first) -> the same
    codes with byte j of each 64-code group holding codes j and j + 32 of that group."""
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(*packed.shape[:-1], -1, 2, GROUP // 2)
    return (codes[..., 0, :] | (codes[..., 1, :] << 4)).reshape(packed.shape)


def e4m3_of_e2m1(nibbles: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, 0..15) -> the e4m3 codes of their values times 2^-6 (the kernel's rule)."""
    return ((nibbles & 8) << 4) | ((nibbles & 7) << 2)


def split_bits(packed: torch.Tensor) -> torch.Tensor:
    """split_groups' codes with their bits placed for a shorter decode (BITS): code j of a group
    (s e1 e0 m) at bits 7 4 3 2, where it is its e4m3 code already (one AND), and code j + 32 at
    bits 5 6 1 0, where two shifts bring s, e0, m (+2) and e1 (-2) to the same places."""
    grouped = split_groups(packed)
    low, high = grouped & 0xF, grouped >> 4
    return e4m3_of_e2m1(low) | ((high & 8) << 2) | ((high & 4) << 4) | (high & 3)


# Four bytes a call; split_groups' layout in 7 instructions a word, split_bits' in 5.
_HALVES_PTX = tl.constexpr("""{
.reg .b32 t0, t1;
shl.b32 t0, $2, 4;
and.b32 t0, t0, 0x80808080;
shl.b32 t1, $2, 2;
and.b32 t1, t1, 0x1C1C1C1C;
or.b32 $0, t0, t1;
and.b32 t0, $2, 0x80808080;
shr.b32 t1, $2, 2;
and.b32 t1, t1, 0x1C1C1C1C;
or.b32 $1, t0, t1;
}""")
_BITS_PTX = tl.constexpr("""{
.reg .b32 t0, t1;
and.b32 $0, $2, 0x9C9C9C9C;
shl.b32 t0, $2, 2;
and.b32 t0, t0, 0x8C8C8C8C;
shr.b32 t1, $2, 2;
and.b32 t1, t1, 0x10101010;
or.b32 $1, t0, t1;
}""")


@triton.jit
def _halves(b, PTX: tl.constexpr, BITS: tl.constexpr):
    """Rearranged bytes (split_groups, or split_bits with BITS) -> (low codes, high codes) as e4m3."""
    if PTX:
        lo, hi = tl.inline_asm_elementwise(_BITS_PTX if BITS else _HALVES_PTX, "=r,=r,r", [b],
                                           dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4)
    elif BITS:
        lo = b & 0x9C
        hi = ((b << 2) & 0x8C) | ((b >> 2) & 0x10)
    else:
        lo = ((b << 4) & 0x80) | ((b << 2) & 0x1C)
        hi = (b & 0x80) | ((b >> 2) & 0x1C)
    return lo.to(tl.float8e4nv, bitcast=True), hi.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _operand(x, F16: tl.constexpr):
    """e4m3 values as the dot takes them: as they are, or with F16 in f16 (exact: e4m3's values
    are f16 values), for f16 MMAs whose fp32 sums are exact where FP8 MMAs' are not."""
    if F16:
        x = x.to(tl.float16)
    return x


@triton.jit
def _fp8_products_kernel(a_ptr, as_ptr, ax_ptr, src_ptr, blk_ptr, w_ptr, s_ptr, out_ptr, N, K,
                         sar, sasr, sxb, swe, swr, sse, ssr, sor,
                         PTX: tl.constexpr, BITS: tl.constexpr, COLS: tl.constexpr, EXPANDED: tl.constexpr,
                         F16: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (block of COLS pairs, N tile): out[pair row, rows] = a[src] . W_expert[rows]^T, a
    as e4m3 codes [*, K] with e8m0 scales as int32 words (4 blocks of 32 a word), W as
    split_groups (or with BITS split_bits) bytes with e8m0 scales as words.

    The dot has 16 columns (its least for 8-bit operands) and a block of pairs needs COLS: the
    other columns carry the chunk's 32-column blocks apart. Column j is pair j // KB and block
    j % KB of a chunk of KB blocks: each block's MMA reads activations only in its own columns
    (the rest load as zeros), so one accumulator keeps every block's sum apart, and the scales
    (weight row's and pair's, per block) are applied once a chunk, not after every MMA."""
    KB: tl.constexpr = 16 // COLS  # 32-column blocks a chunk
    WORDS: tl.constexpr = KB // 4  # scale words a row and chunk
    pid_b = tl.program_id(0)
    expert = tl.load(blk_ptr + pid_b)
    if expert < 0:
        return
    j = tl.arange(0, 16)
    block = j % KB
    src = tl.load(src_ptr + pid_b * COLS + j // KB)
    live = src >= 0
    src = tl.maximum(src, 0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = w_ptr + expert.to(tl.int64) * swe + rows.to(tl.int64)[:, None] * swr
    s_rows = s_ptr + expert.to(tl.int64) * sse + rows * ssr
    k32 = tl.arange(0, 32)
    x_block = ax_ptr + pid_b.to(tl.int64) * sxb
    acc = tl.zeros((BLOCK_N, 16), tl.float32)
    for q in range(0, K // (32 * KB)):
        part = tl.zeros((BLOCK_N, 16), tl.float32)
        for g in tl.static_range(KB // 2):  # 64-code groups: a byte's two codes, two blocks
            b = tl.load(w_rows + (q * 16 * KB + g * 32) + k32[None, :], mask=row_ok[:, None], other=0)
            lo, hi = _halves(b, PTX, BITS)
            lo, hi = _operand(lo, F16), _operand(hi, F16)
            for h in tl.static_range(2):
                kb = 2 * g + h
                if EXPANDED:  # the block's tile as expand_columns lays it out: plain loads, no masks
                    a = tl.load(x_block + (q * KB + kb) * 512 + j[None, :] * 32 + k32[:, None])
                else:
                    a = tl.load(a_ptr + src[None, :] * sar + (q * 32 * KB + kb * 32) + k32[:, None],
                                mask=(live & (block == kb))[None, :], other=0)
                a = _operand(a.to(tl.float8e4nv, bitcast=True), F16)
                if h == 0:
                    part = tl.dot(lo, a, part)
                else:
                    part = tl.dot(hi, a, part)
        # (rows and pairs past the end read 2^0 scales: their sums are never stored, but stay finite)
        ws = tl.load(s_rows[:, None] + q * WORDS + tl.arange(0, WORDS)[None, :], mask=row_ok[:, None],
                     other=0x7F7F7F7F)
        w_exp = tl.reshape((ws[:, :, None] >> (8 * tl.arange(0, 4))[None, None, :]) & 0xFF, (BLOCK_N, KB))
        w_exp = tl.reshape(tl.broadcast_to(w_exp[:, None, :], (BLOCK_N, COLS, KB)), (BLOCK_N, 16))
        xs = tl.load(as_ptr + src * sasr + q * WORDS + block // 4, mask=live, other=0x7F7F7F7F)
        x_exp = (xs >> (8 * (block % 4))) & 0xFF
        # 2^(ew-127) 2^(ex-127) 2^6 (the codes are the e2m1 values times 2^-6)
        acc += part * pow2(w_exp + x_exp[None, :] - 121)
    sums = tl.sum(tl.reshape(acc, (BLOCK_N, COLS, KB)), axis=2)
    cols = pid_b * COLS + tl.arange(0, COLS)
    ok = tl.load(src_ptr + cols) >= 0
    tl.store(out_ptr + cols.to(tl.int64)[None, :] * sor + rows[:, None], sums, mask=ok[None, :] & row_ok[:, None])


def expand_columns(a: torch.Tensor, src: torch.Tensor, block_m: int) -> torch.Tensor:
    """The dot's right operands, as _fp8_products_kernel's EXPANDED form reads them: for each
    block of block_m pairs and each 32-column block b of K, a [16, 32] tile (column-major for
    the MMA) whose column j holds pair j // KB's codes of block b where b % KB == j % KB, zeros
    elsewhere. [blocks, K/32, 16, 32] uint8. A producer (the input's FP8 rounding, the gate/up
    epilogue) could write it in place of the plain rows; here torch builds it."""
    K, kb = a.shape[1], 16 // block_m
    rows = torch.where(src >= 0, src, 0).long().view(-1, block_m)  # [blocks, pairs]
    codes = torch.where((src >= 0).view(-1, block_m, 1), a[rows], 0)  # [blocks, pairs, K]
    tiles = codes.view(codes.shape[0], block_m, K // 32, 32)  # [blocks, pairs, K/32, 32]
    out = torch.zeros(codes.shape[0], K // 32, block_m, kb, 32, dtype=torch.uint8, device=a.device)
    for b in range(kb):  # block b of every chunk goes to column b of each pair
        out[:, b::kb, :, b] = tiles[:, :, b::kb].transpose(1, 2)
    return out.view(codes.shape[0], K // 32, 16, 32)


def fp8_products(a: torch.Tensor, a_scales: torch.Tensor, src: torch.Tensor, block_expert: torch.Tensor,
                 w: torch.Tensor, w_scales: torch.Tensor, block_m: int, tile: dict,
                 expanded: torch.Tensor | None = None, bits: bool = False, f16: bool = False) -> torch.Tensor:
    """out [len(src), N] fp32: row i = a[src[i]] (e4m3 codes [*, K], e8m0 scales [*, K/32]) times
    the block's expert's W^T (w: split_groups bytes [E, N, K/2], scales [E, N, K/32]); rows with
    src -1 are left unwritten. expanded: expand_columns(a, src, block_m), read in place of a;
    bits: w is split_bits bytes; f16: the dots in f16 on mma.sync (fp32-exact sums), not FP8 wgmma."""
    E, N, half = w.shape
    K = 2 * half
    assert block_m in (2, 4) and K % (512 // block_m) == 0 and a.shape[1] == K
    a_words, w_words = a_scales.contiguous().view(torch.int32), w_scales.contiguous().view(torch.int32)
    out = torch.empty(src.numel(), N, dtype=torch.float32, device=a.device)
    grid = (block_expert.numel(), triton.cdiv(N, tile["BLOCK_N"]))
    x = a if expanded is None else expanded
    with mma_sync("moe_fp8_dots", on=f16):  # (F16 keys the compile apart)
        _fp8_products_kernel[grid](a, a_words, x, src, block_expert, w, w_words, out, N, K, a.stride(0),
                                   a_words.stride(0), x.stride(0), w.stride(0), w.stride(1), w_words.stride(0),
                                   w_words.stride(1), out.stride(0), PTX=a.is_cuda, BITS=bits, COLS=block_m,
                                   EXPANDED=expanded is not None, F16=f16, **tile)
    return out


def reference(a, a_scales, src, w_packed, w_scales, block_expert, block_m) -> torch.Tensor:
    """float64 products of the same values, from the checkpoint's bytes; rows with src -1 zero."""
    x = a.view(torch.float8_e4m3fn).double() * torch.exp2(a_scales.double() - 127).repeat_interleave(32, 1)
    out = torch.zeros(src.numel(), w_packed.shape[1], dtype=torch.float64, device=a.device)
    for b, e in enumerate(block_expert.tolist()):
        if e < 0:
            continue
        rows = torch.arange(b * block_m, (b + 1) * block_m, device=a.device)
        live = src[rows] >= 0
        if live.any():
            w = dequantize_fp4_weight(w_packed[e], w_scales[e]).double()
            out[rows[live]] = x[src[rows[live]].long()] @ w.T
    return out


def random_activations(rows: int, k: int, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Faithful-mode activations: e4m3 codes of unit-scale values and e8m0 scales near 2^0."""
    codes = (torch.randn(rows, k, device=dev) * 8).to(torch.float8_e4m3fn).view(torch.uint8)
    scales = torch.randint(120, 130, (rows, k // 32), dtype=torch.uint8, device=dev)
    return codes, scales


# sm_90 SASS (Triton 3.9, bench/kernel_resources.py's compile), the K loop a thread at 2-pair
# blocks, 128 rows on 4 warps (256 codes a thread): 547 instructions gathered (2.1 a code), 529
# laid out; in split_bits' layout 483 and 465 (1.8); 64 rows (128 codes) 369 / 337; the shipped
# gate/up kernel 828 for 256 (3.2). Forms not kept: a scale multiply-add after every 32-column
# MMA took 310 for 64 codes (4.8 a code); the chunk's codes joined into one dot 1,033 for 256
# (the join's PRMTs).
TILES = {"64x4w3s": dict(BLOCK_N=64, num_warps=4, num_stages=3),
         "128x4w3s": dict(BLOCK_N=128, num_warps=4, num_stages=3)}


def forms(kinds: list[str], layouts: dict, scales: tuple, block_m: int) -> Iterator[tuple[str, Callable]]:
    """Each form of the products to time at blocks of block_m pairs, as (name, product):
    product(which, activations, their scales, src, block_expert, laid out) gives gate/up's rows
    (which 0: layouts' and scales' first weight) or down's (1); `laid out` is expand_columns of
    the activations. layouts: the weights as split_groups and split_bits lay them out (and, for
    gluon, split_f16)."""
    for kind in kinds:
        if kind == "gluon":  # 2-pair blocks (call CA: 4 lost everywhere), the activations gathered
            import moe_fp8_gluon as gluon_form  # (it takes this module's decode)
            variants = [(False, prefetch) for prefetch in (False, True)] + [(True, True)]  # (f16 bits, prefetch)
            for (name, tile), columns, (f16_bits, prefetch) in itertools.product(
                    gluon_form.TILES.items(), (8, 16), variants if block_m == 2 else []):
                def product(which, act, act_s, src, blocks, _, tile=tile, columns=columns, f16_bits=f16_bits,
                            prefetch=prefetch):
                    w = layouts["f16" if f16_bits else "bits"][which]
                    return gluon_form.products(act, act_s, src, blocks, w, scales[which], block_m, tile, columns,
                                               f16_bits=f16_bits, prefetch=prefetch)
                yield (f"gluon dots {'f16 bits' if f16_bits else 'bits'} {name} {columns} columns"
                       f"{' prefetched' if prefetch else ''}"), product
            continue
        for (layout, weights), (name, tile), form in itertools.product(
                [(key, layouts[key]) for key in ("groups", "bits")], TILES.items(), ("gathered", "laid out")):
            if kind == "f16" and (layout, form) != ("bits", "gathered"):
                continue  # (the layouts and forms rank alike; the FP8 dots time them)

            def product(which, act, act_s, src, blocks, laid_out, weights=weights, tile=tile, form=form,
                        bits=layout == "bits", f16=kind == "f16"):
                return fp8_products(act, act_s, src, blocks, weights[which], scales[which], block_m, tile,
                                    laid_out if form == "laid out" else None, bits, f16)
            yield f"{kind} dots {layout} {name} {form}", product


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="6,12")
    parser.add_argument("--dots", default="fp8",
                        help="comma-separated MMA kinds: fp8 (wgmma), f16 (mma.sync), gluon (f16 mma.sync in Gluon)")
    args = parser.parse_args()
    kinds = args.dots.split(",")
    if not set(kinds) <= {"fp8", "f16", "gluon"}:
        parser.error(f"--dots: {args.dots!r} names a kind other than fp8, f16 and gluon")
    dev = "cuda"
    E, H, inter, k = (h200.MOE_SHAPE[key] for key in ("E", "H", "inter", "k"))
    torch.manual_seed(0)
    w13 = torch.randint(0, 256, (E, 2 * inter, H // 2), dtype=torch.uint8, device=dev)
    w2 = torch.randint(0, 256, (E, H, inter // 2), dtype=torch.uint8, device=dev)
    s13 = torch.randint(112, 122, (E, 2 * inter, H // 32), dtype=torch.uint8, device=dev)
    s2 = torch.randint(112, 122, (E, H, inter // 32), dtype=torch.uint8, device=dev)
    quad = moe.quad_experts(w13, s13, w2, s2)
    layouts = {"groups": (split_groups(w13), split_groups(w2)), "bits": (split_bits(w13), split_bits(w2))}
    if "gluon" in kinds:
        import moe_fp8_gluon as gluon_form  # (it takes this module's decode)
        layouts["f16"] = (gluon_form.split_f16(w13), gluon_form.split_f16(w2))
    per_expert = sum(t[0].numel() * t.element_size() for t in quad)
    print(f"[moe fp8] {torch.cuda.get_device_name()}; experts {E} x (gate/up {2 * inter} x {H}, down {H} x {inter})",
          flush=True)
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(tokens, H, device=dev).to(torch.bfloat16)
        idx = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(tokens)])
        weights = torch.rand(tokens, k, device=dev)
        touched = len(torch.unique(idx))
        bytes_us = touched * per_expert / h200.HBM_BPS * 1e6
        head = f"[moe fp8] {tokens} tokens, {touched} experts (bytes {bytes_us:.0f} us)"
        shipped = h200.graph_time(lambda: moe.fp4_moe(x, idx, weights, *quad, 10.0, small=True, act_quant=True,
                                                      round_input=True), iters=10)
        print(f"{head}: shipped faithful {shipped * 1e6:.0f} us", flush=True)
        a, a_scales = random_activations(tokens, H, dev)
        for block_m in (2, 4):  # pairs a block
            plan = moe.RoutePlan(idx, weights, E, block_m)
            h, h_scales = random_activations(plan.rows, inter, dev)
            own_rows = torch.where(plan.tokens >= 0, torch.arange(plan.rows, device=dev, dtype=torch.int32), -1)
            operands = ((a, a_scales, plan.tokens, w13, s13), (h, h_scales, own_rows, w2, s2))
            refs = [reference(act, act_s, src, packed, scales, plan.block_expert, block_m)
                    for act, act_s, src, packed, scales in operands]
            laid_out = expand_columns(a, plan.tokens, block_m), expand_columns(h, own_rows, block_m)
            for name, product in forms(kinds, layouts, (s13, s2), block_m):
                def both():
                    return tuple(product(which, act, act_s, src, plan.block_expert, laid_out[which])
                                 for which, (act, act_s, src, _, _) in enumerate(operands))
                label = f"{head}: {block_m}-pair {name}"
                try:
                    outs = both()
                except Exception as e:  # a tile Triton cannot compile here: say so, time the rest
                    print(f"{label} failed ({type(e).__name__}: {str(e)[:300]})", flush=True)
                    continue
                errors = []
                for out, ref, (_, _, src, _, _) in zip(outs, refs, operands):
                    live = src >= 0
                    errors.append(((out[live].double() - ref[live]).abs().max() / ref[live].abs().max()).item())
                t = h200.graph_time(both, iters=10)
                print(f"{label} {t * 1e6:.0f} us (worst error / largest {max(errors):.1e})", flush=True)


if __name__ == "__main__":
    main()
