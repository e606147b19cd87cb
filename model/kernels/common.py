"""Pieces the Triton kernels share: decoding FP8/FP4 bytes in registers.

On the GPU an e4m3 byte is reinterpreted as float8e4nv and converted by hardware, and words
of packed e2m1 codes are decoded to bf16 pairs by a few PTX instructions per value. The CPU
interpreter (CI) cannot be trusted with low-precision types and runs no PTX, so there the
codes are decoded arithmetically to fp32 (exact for every code); both give the same values.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

from . import pdl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def sm_count(device: torch.device) -> int:
    """The GPU's SMs; 2 for the interpreter's CPU, so that programs sized by it take several
    pieces of work each in CPU tests."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2


def fp8_tensor_cores(device) -> bool:
    """Whether a GPU's tensor cores multiply e4m3 codes: from sm_89 (Ada, Hopper)."""
    return torch.cuda.get_device_capability(device) >= (8, 9)


# Dot precision: exact fp32 in the interpreter (CI compares with the reference bit-closely),
# three-pass TF32 on the GPU: one-pass TF32 rounds activations to 10 bits, which on H200 put
# the golden logits past 1e-2 (measured 2026-11-30); tf32x3 is fp32-accurate on tensor cores.
# DSFLASH_DOT_PRECISION=ieee (or tf32) overrides it, to tell rounding from bugs.
DOT = tl.constexpr(os.environ.get("DSFLASH_DOT_PRECISION") or ("ieee" if interpreting() else "tf32x3"))
# Where one operand holds dequantized FP8/FP4 values (at most 4 significant bits, times a power
# of two, or an e4m3 scale: at most 8 bits), that operand is exact in TF32. Splitting only the
# other one into a TF32 head and its remainder then gives tf32x3's accuracy in two passes.
_SPLIT_ONE = tl.constexpr(DOT.value == "tf32x3")


# fp32-accurate dots of two fp32 operands as dot_fp32's three TF32 passes of masked heads
# (False: Triton's tf32x3; the interpreter computes either exactly): the fp32 weights of the
# decode GEMM (fp8_gemm's skinny kernel: the mHC mixes at decode rows), and the mHC kernels'
# where RAW_HEADS does not take them. Read at each launch. sm_90 SASS
# (bench/kernel_resources.py): hc_mixes' loop 264 -> 191 instructions a thread, hc_site's 741 ->
# 573, the skinny kernel's on an fp32 weight 652 -> 455; the same accuracy (dot_fp32). H100,
# forty-sixth session, 16,384 rows: the mixes 752 -> 736 us, the attention site's launches 1,341
# -> 1,320, the FFN site's 2,406 -> 2,387 (~1-2%); decode's small products untimed, so off.
TF32_HEADS = False
# The mHC kernels' fp32 dots at prefill rows (hc_streams: hc_mixes, hc_site; decode rows'
# hc_expand_mix_parts with hc_streams.RAW_HEADS_AT_DECODE) as dot_fp32_raw's three TF32 passes
# whose heads are the operands as they lie. Read at each launch (ahead of TF32_HEADS). H100,
# fiftieth session, 16,384 rows of 4 x 5,120 (bench/prefill_passes.py --sections mixes):
# hc_mixes 744 us in Triton's tf32x3, 730 in dot_fp32's heads, 545.5 with the raw heads; the
# largest error against the float64 product 4.0e-7 of the largest result in both older forms,
# 6.1e-7 with the raw heads. bench/mixes_parts.py placed it: the loop without its dots
# 494-525 us, with one TF32 dot 492-534.
RAW_HEADS = True
# The GPU's tensor cores read an fp32 operand of a TF32 dot truncated (its low 13 mantissa bits
# dropped); the interpreter computes such a dot in full fp32, so there dot_fp32_raw makes its
# heads itself (where tests force _SPLIT_ONE to check how the passes are put together).
_READS_TRUNCATED = tl.constexpr(not interpreting())


# Kernels whose dots compile to Ampere-style mma.sync instead of Hopper's wgmma (see
# mma_sync), a comma-separated DSFLASH_MMA_SYNC: "decode_gemm" (fp8_gemm's transposed decode
# kernel, the default), "short_experts" / "tall_experts" (fp4_moe's 4-row / taller blocks;
# short ones measured slower so: 316 against 298 us a layer at batch 1); "none".
MMA_SYNC = frozenset(os.environ.get("DSFLASH_MMA_SYNC", "decode_gemm").split(",")) - {"none", ""}


@contextlib.contextmanager
def mma_sync(kernel: str, on: bool | None = None):
    """Launches inside compile, if they compile, with DISABLE_MMA_V3 (Triton reads it while
    compiling and keys its on-disk cache by it; a compiled kernel stays in its in-memory cache
    whatever the variable says later) when `kernel` is in MMA_SYNC, or where `on` says so (a
    benchmark's form, keyed apart by its own constexprs). Why: a wgmma whose left
    operand is decoded in registers is waited for before the next one issues, so a decode
    kernel's dozen small dependent MMAs per K step each expose its latency; mma.sync's are
    short. H200, 2026-12-01 (bench/decode_gemm_floor.py, 6 rows): wkv 11.6 -> 9.9 us, wq_a
    14.8 -> 11.5, shared w1 20.2 -> 16.5, wo_b 38.9 -> 37.9."""
    if not (kernel in MMA_SYNC if on is None else on) or os.environ.get("DISABLE_MMA_V3") is not None:
        yield
        return
    os.environ["DISABLE_MMA_V3"] = "1"
    try:
        yield
    finally:
        del os.environ["DISABLE_MMA_V3"]


@triton.jit
def _tf32_head(x):
    """x with its low 13 mantissa bits cleared: exact in TF32, and x - head is the rest."""
    return (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def bf16_head(x):
    """x with its low 16 bits cleared: its top 8 significant bits, exact in bf16. x - head is
    exact in fp32 and holds the 16 below, so two heads and what is left (8 bits: exact in bf16
    too) cut an fp32 value into three bf16 parts with masks and subtractions, no rounding."""
    return (x.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)


@triton.jit
def dot_exact_rhs(a, b, acc):
    """acc + a @ b where every value of b is exact in TF32 (see above)."""
    if _SPLIT_ONE:
        head = _tf32_head(a)
        return tl.dot(a - head, b, tl.dot(head, b, acc, input_precision="tf32"), input_precision="tf32")
    return tl.dot(a, b, acc, input_precision=DOT)


@triton.jit
def _tf32_nearest(x):
    """x rounded to its nearest TF32 value (ties away from zero) by integer add and mask; x -
    it is exact in fp32 and at most half a TF32 step."""
    return ((x.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def dot_fp32(a, b, acc):
    """acc + a @ b for finite a and b to fp32's accuracy on the tensor cores where DOT is
    tf32x3: three TF32 passes of nearest heads and their remainders (which the tensor cores
    read truncated to TF32), made with 3 instructions a value where Triton's own tf32x3 spends
    ~5 (it also keeps infinities, which this form turns into NaN; sm_90 SASS,
    bench/kernel_resources.py --kernel hc_site). As in Triton's form the passes sum from zero
    and join acc by an fp32 add: the tensor cores' own accumulation is reported to truncate
    (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021, and later measurements),
    which over a 20,480-column row would bias the sums (~2e-4 of the largest in a model of
    it, against ~1e-6). Largest error
    of 20,480-term rows (products summed in fp64, CPU emulation): 7e-8 of the largest
    result in both forms, an fp32 GEMM's 5e-7."""
    if _SPLIT_ONE:
        a_head = _tf32_nearest(a)
        b_head = _tf32_nearest(b)
        part = tl.dot(a_head, b - b_head, tl.zeros(acc.shape, tl.float32), input_precision="tf32")
        part = tl.dot(a - a_head, b_head, part, input_precision="tf32")
        return acc + tl.dot(a_head, b_head, part, input_precision="tf32")
    return tl.dot(a, b, acc, input_precision=DOT)


@triton.jit
def dot_fp32_raw(a, b, acc):
    """acc + a @ b for finite a and b to fp32's accuracy in three TF32 passes, as dot_fp32 but
    with the operands as they lie for heads: the tensor cores read them truncated to TF32, so
    only the remainders (x - _tf32_head(x), exact in fp32, up to 13 significant bits, read
    truncated in turn) are made, ~2 instructions a value, and the loaded operand goes to the
    tensor cores as it was loaded (no head of it to write for them). A remainder is below 2^-10
    of its value and its truncation loses up to 2^-10 of it, so at most 2^-20 of a product
    (2^-21 with dot_fp32's nearest heads); rows of 20,480 columns stay near an fp32 GEMM's
    accuracy (RAW_HEADS' figures). The passes sum from zero and join acc by an fp32 add,
    as in dot_fp32."""
    if _SPLIT_ONE:
        a_rest = a - _tf32_head(a)
        b_rest = b - _tf32_head(b)
        if not _READS_TRUNCATED:
            a = a - a_rest
            b = b - b_rest
        part = tl.dot(a, b_rest, tl.zeros(acc.shape, tl.float32), input_precision="tf32")
        part = tl.dot(a_rest, b, part, input_precision="tf32")
        return acc + tl.dot(a, b, part, input_precision="tf32")
    return tl.dot(a, b, acc, input_precision=DOT)


@triton.jit
def dot_exact_rhs_raw(a, b, acc):
    """acc + a @ b where every value of b is exact in TF32, with a as it lies for its head (as
    dot_fp32_raw; on the GPU the tensor cores read a truncated to TF32, the head dot_exact_rhs
    makes). The two passes sum from zero and join acc by an fp32 add: chained into acc over a
    5,120-column row, the tensor cores' truncating sums lost 2.5e-5 of the largest result
    (tall_bf16 on an H100, fiftieth session)."""
    if _SPLIT_ONE:
        rest = a - _tf32_head(a)
        head = a if _READS_TRUNCATED else a - rest
        part = tl.dot(head, b, tl.zeros(acc.shape, tl.float32), input_precision="tf32")
        return acc + tl.dot(rest, b, part, input_precision="tf32")
    return tl.dot(a, b, acc, input_precision=DOT)


@triton.jit
def dot_exact_lhs(a, b, acc):
    """acc + a @ b where every value of a is exact in TF32 (the mirror of dot_exact_rhs)."""
    if _SPLIT_ONE:
        head = _tf32_head(b)
        return tl.dot(a, b - head, tl.dot(a, head, acc, input_precision="tf32"), input_precision="tf32")
    return tl.dot(a, b, acc, input_precision=DOT)


@triton.jit
def e4m3_to_float(codes, HW_FP8: tl.constexpr):
    """uint8 e4m3 codes -> fp32 values (sign | 4 exponent bits, bias 7 | 3 mantissa bits)."""
    if HW_FP8:
        return codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    c = codes.to(tl.int32)
    exponent = (c >> 3) & 0xF
    mantissa = (c & 0x7).to(tl.float32)
    normal = (1.0 + mantissa / 8.0) * tl.exp2((exponent - 7).to(tl.float32))
    subnormal = mantissa / 8.0 * 0.015625  # 2^-6
    magnitude = tl.where(exponent == 0, subnormal, normal)
    return tl.where((c & 0x80) != 0, -magnitude, magnitude)


# e4m3 codes to bf16 by integer ops: the 7 magnitude bits placed at bf16 bits 4..10 make a
# bf16 whose exponent field is the e4m3 one (bias 7 where bf16's is 127) and whose mantissa
# starts with the 3 e4m3 bits: the value times 2^-120, subnormals included; the sign goes to
# bit 15. One multiply by the bf16 2^(e-7) (exponent field e + 120, so e <= 134) then gives the
# value times its scale 2^(e-127) exactly.
# Two int32 words $4 $5 of four codes each (columns 4c..4c+3) and their (shared) scale as its
# bf16 pair $6 (word_scales) -> four bf16 pairs $0..$3, pair t = (code t of word 0, code t of
# word 1), in 3 integer instructions a pair: prmt's sign-replicating selector (8 | byte) puts
# code t's sign in all 8 bits of its half's high byte, a left shift by 4 places the magnitude
# at bits 4..10 with a sign copy at bit 15, and one mask keeps those. (Twenty-fifth session,
# H200: 6-13% faster GEMMs than the 6-instruction form with the scale made once a word pair.)
_E4M3_WORDS_PTX = tl.constexpr("\n".join([
    "{", ".reg .b32 c;",
    *[f"prmt.b32 c, $4, $5, {(12 + t) << 12 | (4 + t) << 8 | (8 + t) << 4 | t:#06x}; shl.b32 c, c, 4; "
      f"and.b32 ${t}, c, 0x87F087F0; mul.rn.bf16x2 ${t}, ${t}, $6;" for t in range(4)], "}"]))


@triton.jit
def word_scales(scale_bytes, PTX: tl.constexpr, SMALL: tl.constexpr):
    """e8m0 scale bytes as e4m3_words (with the same flags) takes them, worked out once a scale
    before they spread over the words each covers: for the PTX decode the bf16 pair 2^(e-7) it
    multiplies by (exponent field e + 120), else the biased exponent e (int32)."""
    e = scale_bytes.to(tl.int32)
    if PTX and SMALL:
        return bf16_pair(e + 120)
    return e


@triton.jit
def bf16_pair(field):
    """int32 biased exponent fields (0..255) -> the bf16 pair of that power of two in both
    halves: a decode's scale, multiplied in by one mul.rn.bf16x2 a pair."""
    bits = field << 7
    return bits | (bits << 16)


@triton.jit
def e4m3_words(words, scales, PTX: tl.constexpr, SMALL: tl.constexpr):
    """int32 words of four e4m3 codes (code t in byte t: column 4c + t of a row) and each word's
    e8m0 scale, as word_scales with the same flags gives it -> four tiles, tile t
    holding code t of every word times 2^(e-127): bf16 on the GPU (by integer ops and one
    multiply when SMALL, every e <= 134; by the hardware conversion otherwise), fp32 by
    arithmetic in the interpreter. A thread's two neighbouring words are decoded together and
    must share their scale."""
    if PTX and SMALL:
        values = tl.inline_asm_elementwise(_E4M3_WORDS_PTX, "=r,=r,=r,=r,r,r,r,r",
                                           [words, scales], dtype=(tl.bfloat16,) * 4, is_pure=True, pack=2)
    else:
        scale = pow2(scales)
        values = (e4m3_to_float((words & 0xFF).to(tl.uint8), PTX) * scale,
                  e4m3_to_float(((words >> 8) & 0xFF).to(tl.uint8), PTX) * scale,
                  e4m3_to_float(((words >> 16) & 0xFF).to(tl.uint8), PTX) * scale,
                  e4m3_to_float(((words >> 24) & 0xFF).to(tl.uint8), PTX) * scale)
        if PTX:
            values = (values[0].to(tl.bfloat16), values[1].to(tl.bfloat16), values[2].to(tl.bfloat16),
                      values[3].to(tl.bfloat16))
    return values


@triton.jit
def pow2(exponent):
    """The fp32 2^(e-127) for a biased exponent e (int32, 1 <= e <= 254), built from its bits
    (exact; e = 0 gives 0)."""
    return (exponent << 23).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_to_float(nibbles):
    """4-bit e2m1 codes (int32, sign in bit 3) -> fp32: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives.
    Integer operations only, on the fp32 bit patterns: magnitudes 1 .. 6 (codes 2..7) are
    0x3F000000 + code<<22, 0.5 is 0x3F000000, and the sign is bit 31 (so code 8 is -0.0,
    as the reference decodes it: a float negation compiled for the GPU may give +0.0)."""
    m = nibbles & 0x7
    magnitude = tl.where(m >= 2, 0x3F000000 + (m << 22), tl.where(m == 1, 0x3F000000, 0))
    return (magnitude | ((nibbles & 0x8) << 28)).to(tl.float32, bitcast=True)


# Quad units: the layout fp4_moe keeps routed experts in. Four e2m1 codes (columns 4c .. 4c+3
# of a row) share 16 bits, code t's bits (m, e0, e1, sign) at QUAD_PLACES[t]. At bf16 bits
# 6 (m), 7-8 (e0 e1: the exponent field's two low bits) and 15 (sign) a code is a bf16 worth
# its e2m1 value times 2^-126 (code 1, 0.5, a subnormal): code 0 lies there already, codes 1
# and 2 one left shift away, code 3 takes the bits left. A register of two neighbouring units
# thus decodes into four bf16 pairs, the pairs a tensor-core operand holds, in 11 integer
# instructions (bytes of two codes took 19, with the two spreading them over the halves).
QUAD_PLACES = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (10, 11, 13, 14))
_BF16_PLACES = QUAD_PLACES[0]


def quad_units(packed: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 codes, uint8 [..., K/2] (two a byte, low nibble first, as checkpoints store
    them), as int16 quad units [..., K/4]: the same bytes, rearranged (any device)."""
    assert packed.dtype == torch.uint8 and packed.shape[-1] % 2 == 0, "two codes a byte, whole units"
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(*packed.shape[:-1], -1, 4).to(torch.int32)
    units = torch.zeros(codes.shape[:-1], dtype=torch.int32, device=packed.device)
    for t, places in enumerate(QUAD_PLACES):
        for bit, place in enumerate(places):
            units |= ((codes[..., t] >> bit) & 1) << place
    return (units - ((units >> 15) << 16)).to(torch.int16)  # 16 bits as a signed int16


def _quad_place_ptx(places: tuple[int, ...], dst: str) -> str:
    """PTX: the code at `places` of both units of register $4 -> the bf16 pair in dst (times
    2^-126): a shift and a mask for each distance its bits move, ORed together."""
    masks: dict[int, int] = {}
    for source, target in zip(places, _BF16_PLACES):
        masks[target - source] = masks.get(target - source, 0) | (0x10001 << target)
    lines = []
    for i, (shift, mask) in enumerate(masks.items()):
        out = dst if i == 0 else "q"
        src = "$4" if shift == 0 else out
        if shift:
            lines.append(f"{'shl' if shift > 0 else 'shr'}.b32 {out}, $4, {abs(shift)};")
        lines.append(f"and.b32 {out}, {src}, {mask:#010x};")
        if i:
            lines.append(f"or.b32 {dst}, {dst}, q;")
    return " ".join(lines)


# Times 2^-126 -> times the scale: with small scales (every e in 1..128) one multiply by the
# bf16 2^(e-1); otherwise two, by 2^126 (exponent field 253 in both halves) and by 2^(e-127).
_TWO126 = "0x7E807E80"


def _e2m1_quads_ptx(small: bool) -> str:
    """PTX for a register $4 of two quad units and their scale pair $5 (quad_scales; $6, the
    second unit's, is the same): four bf16 pairs $0..$3, pair t = code t of each unit."""
    two126 = [] if small else [".reg .b32 h;", f"mov.b32 h, {_TWO126};"]
    by_two126 = "" if small else " mul.rn.bf16x2 ${t}, ${t}, h;"
    multiply = [f"{by_two126.format(t=t)} mul.rn.bf16x2 ${t}, ${t}, $5;" for t in range(4)]
    return "\n".join(["{", ".reg .b32 q;", *two126,
                      *[_quad_place_ptx(places, f"${t}") for t, places in enumerate(QUAD_PLACES)], *multiply, "}"])


_E2M1_QUADS_SMALL = tl.constexpr(_e2m1_quads_ptx(True))
_E2M1_QUADS_ANY = tl.constexpr(_e2m1_quads_ptx(False))
_QUAD_PLACES = tl.constexpr(QUAD_PLACES)


@triton.jit
def quad_scales(exponents, PTX: tl.constexpr, SMALL: tl.constexpr):
    """int32 e8m0 scale exponents e -> what e2m1_quads takes: on the GPU the bf16 pair it
    multiplies by (2^(e-1) with SMALL, every e in 1..128; else 2^(e-127), 0 for e = 0), made
    once per scale before it is spread over the scale's 8 units; the exponents elsewhere."""
    if PTX:
        if SMALL:  # no test for e = 0 (2^-1 it would give): it cost a compare and a select a scale
            field = exponents + 126
        else:
            field = exponents
        return bf16_pair(field)
    return exponents


@triton.jit
def _quad_code(units, PLACES: tl.constexpr):
    """The 4-bit code at PLACES (m, e0, e1, sign) of each int32 unit."""
    return (((units >> PLACES[0]) & 1) | (((units >> PLACES[1]) & 1) << 1) | (((units >> PLACES[2]) & 1) << 2)
            | (((units >> PLACES[3]) & 1) << 3))


@triton.jit
def e2m1_quads(units, scales, PTX: tl.constexpr, SMALL: tl.constexpr):
    """int16 quad units (QUAD_PLACES) and each unit's scale from quad_scales -> four tiles,
    tile t holding code t of every unit times 2^(e-127) (0 for e = 0, which SMALL excludes):
    bf16 through PTX on the GPU (a thread's two neighbouring units decoded together; they
    share their scale), fp32 by arithmetic elsewhere. Both exact: an e2m1 value has 2
    significant bits."""
    if PTX:
        values = tl.inline_asm_elementwise(_E2M1_QUADS_SMALL if SMALL else _E2M1_QUADS_ANY, "=r,=r,=r,=r,r,r,r",
                                           [units, scales], dtype=(tl.bfloat16,) * 4, is_pure=True, pack=2)
    else:
        u = units.to(tl.int32)
        scale = pow2(scales)
        values = (e2m1_to_float(_quad_code(u, _QUAD_PLACES[0])) * scale,
                  e2m1_to_float(_quad_code(u, _QUAD_PLACES[1])) * scale,
                  e2m1_to_float(_quad_code(u, _QUAD_PLACES[2])) * scale,
                  e2m1_to_float(_quad_code(u, _QUAD_PLACES[3])) * scale)
    return values


def byte_words(t: torch.Tensor) -> torch.Tensor | None:
    """A uint8 tensor's last dim as int32 words (4 bytes each, the first in the low bits), or
    None where its layout does not allow the view. Triton's pipeliner prefetches loads of 4
    bytes or more a thread into shared memory; e8m0 scales loaded byte by byte it does not, and
    each such load waits out a DRAM round trip inside the loop."""
    if t.dim() == 0 or t.shape[-1] % 4 or t.stride(-1) != 1 or t.storage_offset() % 4:
        return None
    if any(stride % 4 for stride in t.stride()[:-1]):
        return None
    return t.view(torch.int32)


@triton.jit
def step_scales(row_words, first, n_words, row_ok, other, N: tl.constexpr, S: tl.constexpr):
    """The S scale bytes first .. first + S - 1 of N rows, as int32 [N, S], read as int32 words
    (row_words: [N] pointers to each row's first word, n_words to a row; rows not row_ok read
    `other` for every byte). A step of fewer than 4 scales lies in one word (S divides 4 and
    first is a multiple of S); more are whole words from a multiple of 4."""
    if S >= 4:
        w = first // 4 + tl.arange(0, S // 4)
        words = tl.load(row_words[:, None] + w[None, :], mask=row_ok[:, None] & (w < n_words)[None, :], other=other)
        return tl.reshape((words[:, :, None] >> (8 * tl.arange(0, 4))[None, None, :]) & 0xFF, (N, S))
    else:
        word = tl.load(row_words + first // 4, mask=row_ok, other=other)
        return (word[:, None] >> (8 * (first % 4 + tl.arange(0, S)))[None, :]) & 0xFF


def scale_bytes_within(low: int, high: int, *scales: torch.Tensor) -> bool:
    """Whether every e8m0 scale byte of these tensors lies in low..high, which decides if a PTX
    decoder may scale with one multiply. Reads the bytes (a host sync): callers work it out
    once per weight and keep the answer."""
    return all(int(s.min()) >= low and int(s.max()) <= high for s in scales if s.numel())


def bf16_parts(x: torch.Tensor, splits: int, interleave: int = 1) -> torch.Tensor:
    """[splits, *x.shape] bf16 whose sum is x: each part rounds what the ones before left over
    (three parts carry fp32's 24 significant bits). With `interleave` g, each row's columns
    come grouped by their remainder mod g: column c goes to (c % g) * (C / g) + c // g. One
    launch on the GPU (torch's form is ~9 passes over the data); torch's form elsewhere."""
    if x.is_cuda:
        return bf16_parts_kernel(x, splits, interleave)
    parts, rest = [], group_columns(x.float(), interleave)
    for _ in range(splits):
        parts.append(rest.to(torch.bfloat16))
        rest = rest - parts[-1].float()
    return torch.stack(parts)


def group_columns(x: torch.Tensor, g: int) -> torch.Tensor:
    """x with each row's columns grouped by their remainder mod g: column c goes to
    (c % g) * (C / g) + c // g (the layout bf16_parts(..., interleave=g) gives)."""
    if g == 1:
        return x
    C = x.shape[-1]
    return x.reshape(*x.shape[:-1], C // g, g).transpose(-1, -2).reshape(x.shape)


@triton.jit
def bf16_rne(x):
    """fp32 x rounded to the nearest bf16 (ties to even), as fp32. On the bits: the
    interpreter's cast truncates, the GPU's rounds; this rounds alike on both."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)


@triton.jit
def as_stored(x, BF16: tl.constexpr):
    """fp32 x as a tensor of BF16 stores it (to nearest, ties to even), so that what a kernel
    goes on to compute from a value it stores is computed from the stored value; as fp32. On
    the GPU by its conversion (one instruction; a NaN stays a NaN, where bf16_rne's carry
    would wrap the GPU's 0x7FFFFFFF to -0.0); in the interpreter, whose conversion truncates,
    by bf16_rne, NaNs passed by."""
    if BF16:
        if _READS_TRUNCATED:  # (on the GPU)
            x = x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        else:
            x = tl.where(x != x, x, bf16_rne(x))
    return x


@triton.jit
def grouped_column(col, C, G: tl.constexpr):
    """Where column col of a C-wide row goes when the row's columns are grouped by their
    remainder mod G (group_columns' layout, as fp4_moe reads its activations)."""
    return (col % G) * (C // G) + col // G


@triton.jit
def _bf16_parts_kernel(x_ptr, out_ptr, n, C, sxr, sop, SPLITS: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr,
                       PDL: tl.constexpr):
    """Elements e of x (row e // C, column e % C, rows sxr apart) -> their SPLITS parts at
    out[p, row, (col % G) * (C / G) + col // G] (rows C apart)."""
    pdl.wait_for_inputs(PDL)
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = e < n
    row = e // C
    col = e % C
    rest = tl.load(x_ptr + row * sxr + col, mask=live, other=0.0).to(tl.float32)
    at = out_ptr + row * C + grouped_column(col, C, G)
    for p in tl.static_range(SPLITS):
        head = bf16_rne(rest)  # the cast of the rounded value is exact everywhere
        tl.store(at + p * sop, head.to(tl.bfloat16), mask=live)
        rest = rest - head


def bf16_parts_kernel(x: torch.Tensor, splits: int, interleave: int = 1) -> torch.Tensor:
    """bf16_parts in one launch (any device the kernels run on)."""
    C = x.shape[-1]
    assert C % interleave == 0
    rows = x.reshape(-1, C)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(splits, *x.shape, dtype=torch.bfloat16, device=x.device)
    n = rows.numel()
    if n:
        block = 1024
        _bf16_parts_kernel[(triton.cdiv(n, block),)](rows, out, n, C, rows.stride(0), out[0].numel(), SPLITS=splits,
                                                     G=interleave, BLOCK=block, **pdl.options(rows.device))
    return out
