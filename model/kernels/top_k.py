"""The indexer's top-k: per row of scores [n, N], the k best ids in ascending order, by a
radix select instead of a sort.

Order: higher score first; among equal scores the lower id (-0.0 equals 0.0); -inf and NaN
scores are never returned: rows with fewer than k of the others end in -1s. A positive NaN
still takes a place among the k (it ranks above +inf) and leaves a -1: what a topk over
IEEE-ordered bits does, which the reference below is.

How: each score maps to a uint32 key that orders as the scores do. The threshold key T (the
k-th largest) is found one digit of RADIX_BITS at a time, most significant first: a pass
counts, per digit value, the row's keys that match the digits found so far, and the digit
is where the running count from the top reaches k. A last pass then writes, in id order,
every id whose key is above T and the first (k - #above) ids whose key equals T, at
positions from running counts: the output comes out ascending without a sort.

Rows are cut into chunks, one program each (128 rows alone would fill 128 of the H200's 132
SMs, 6 decode rows 6 of them). A pass's chunks add their counts atomically; each program of
the next launch works the digits found so far out of them again (256 counts a pass: no
launch of its own). The last counting pass also keeps per-chunk counts, from which a chunk's
writing program knows how many ids the chunks before it write. Launches: one zeroing,
ceil(32 / RADIX_BITS) counting passes and one writing pass, each reading the scores once;
no host sync, so the whole can be captured in a CUDA graph. Where the plan gives a row one
chunk (a decode step's rows, up to 16K entries; or any rows, 1,024 of them at once) every pass
runs in one program and one launch instead (_select_kernel): in an eager decode layer each
launch cost the host more than its GPU work.

Cost: for sm_90, Triton 3.9 compiles tl.histogram to one shared-memory atomic add per
counted score (masked ones branch around it), so a pass costs a few instructions per score
plus the waits where a warp's scores hit the same bin: most in the first pass, whose digit is
the sign and exponent bits where scores bunch; later passes count only the scores matching the
digits found so far. Wider digits mean fewer passes, each one reading the scores once, and
more bins to clear and sum per step (radix_bits; bench/h200.py times 11, 8 and 6).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

RADIX_BITS = 8  # 4 counting passes of 256 bins (see Cost above)
_BLOCK = 2048  # elements per step of a program
_PROGRAMS = 1024  # what a launch aims for: a few per SM, to keep loads in flight
_MIN_CHUNK = 8 * _BLOCK  # a chunk also re-derives the digits and reads the chunk counts: not too short
_NEG_INF_KEY = tl.constexpr(0x007FFFFF)  # key of -inf; NaNs with the sign bit set lie below it
_POS_INF_KEY = tl.constexpr(0xFF800000)  # key of +inf; NaNs without it lie above
_LOW_KEY = tl.constexpr(0)  # -inf and negative NaNs: ranked last, never returned
_HIGH_KEY = tl.constexpr(0xFFFFFFFF)  # positive NaNs: ranked first, never returned


def top_k_ascending_ref(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The k best ids per row, ascending; ties at the boundary go to the lower id; -1 pads rows
    with fewer than k finite scores. Linear in the row length (no full sort), and no host sync:
    one topk over unique int64 keys, score bits above and (width - 1 - id) below, so equal
    scores rank by id (topk's own order among equal values is unspecified)."""
    n, width = scores.shape
    if k <= 0:
        return torch.zeros(n, 0, dtype=torch.long, device=scores.device)
    scores = scores.float()
    bits = torch.where(scores == 0, 0.0, scores).view(torch.int32)  # -0.0 ties with 0.0
    # IEEE floats order like sign-magnitude ints: flip the magnitude bits of negatives.
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    key = (ordered << 32) | (width - 1 - torch.arange(width, device=scores.device))
    ids = width - 1 - (torch.topk(key, k, dim=-1).values & 0xFFFFFFFF)
    ids = torch.where(scores.gather(-1, ids) > float("-inf"), ids, width)
    ids = ids.sort(dim=-1).values
    return torch.where(ids < width, ids, -1)


def top_k_ascending(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [n, N] -> ids [n, k] int64, as top_k_ascending_ref: the kernel on the GPU."""
    return top_k_ascending_kernel(scores, k) if scores.is_cuda else top_k_ascending_ref(scores, k)


@triton.constexpr_function
def _digit_shift(pass_: int, bits: int) -> int:
    """Where pass `pass_`'s digit starts: digits run from bit 31 down, the last one may be short."""
    return max(32 - bits * (pass_ + 1), 0)


@triton.constexpr_function
def _digit_mask(pass_: int, bits: int) -> int:
    return (1 << (32 - bits * pass_ - _digit_shift(pass_, bits))) - 1


@triton.constexpr_function
def _found_mask(pass_: int, bits: int) -> int:
    """The bits that passes before `pass_` have fixed (uint32)."""
    return (0xFFFFFFFF << (32 - bits * pass_)) & 0xFFFFFFFF


@triton.jit
def _keys(x):
    """fp32 scores -> uint32 keys in the scores' order: the sign bit set for positives, every bit
    flipped for negatives; -0.0 becomes 0.0 first (on the bits: a float compare could be folded
    away). -inf and NaNs collapse to _LOW_KEY or _HIGH_KEY, which the writing pass skips."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = tl.where(bits == 0x80000000, 0, bits)
    key = tl.where((bits & 0x80000000) != 0, ~bits, bits | 0x80000000)
    key = tl.where(key <= _NEG_INF_KEY, _LOW_KEY, key)
    return tl.where(key > _POS_INF_KEY, _HIGH_KEY, key)


@triton.jit
def _take_digit(counts, prefix, rest, PASS: tl.constexpr, BITS: tl.constexpr):
    """Pass PASS's digit of the threshold from its counts [BINS] -> (the threshold's bits so
    far, how many keys equal to it in those bits still belong to the k)."""
    bins = tl.arange(0, 1 << BITS)
    at_least = tl.cumsum(counts, 0, reverse=True)  # keys whose digit is >= the bin's
    # the highest digit with at least `rest` keys from it up (bin 0 always has: k <= N)
    digit = tl.max(tl.where(at_least >= rest, bins, 0))
    rest -= tl.sum(tl.where(bins > digit, counts, 0))
    return prefix | (digit.to(tl.uint32) << _digit_shift(PASS, BITS)), rest


@triton.jit
def _found_digits(hist_ptr, pass_stride, k, PASSES: tl.constexpr, BITS: tl.constexpr):
    """The digits that the counts of the first PASSES passes fix ([PASSES, BINS] int32, pass_stride
    apart) -> (those bits of the threshold key, in place, uint32; how many keys equal to the
    threshold in those bits still belong to the k: k minus the keys above it)."""
    bins = tl.arange(0, 1 << BITS)
    prefix = tl.zeros((), tl.uint32)
    rest = k
    for p in tl.static_range(PASSES):
        prefix, rest = _take_digit(tl.load(hist_ptr + p * pass_stride + bins), prefix, rest, p, BITS)
    return prefix, rest


@triton.jit
def _digit_counts(x_row, lo, hi, prefix, PASS: tl.constexpr, LAST: tl.constexpr, BITS: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Counts by digit PASS of the keys in columns [lo, hi) that match the digits found so far
    (prefix), and (LAST) how many keys are above them."""
    BINS: tl.constexpr = 1 << BITS
    FOUND: tl.constexpr = _found_mask(PASS, BITS)
    counts = tl.zeros((BINS,), tl.int32)
    above = tl.zeros((), tl.int32)
    for start in range(lo, hi, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        live = cols < hi
        key = _keys(tl.load(x_row + cols, mask=live, other=0.0))
        digit = ((key >> _digit_shift(PASS, BITS)) & _digit_mask(PASS, BITS)).to(tl.int32)
        if PASS == 0:
            counts += tl.histogram(digit, BINS, mask=live)
        else:
            counts += tl.histogram(digit, BINS, mask=live & ((key & FOUND) == prefix))
        if LAST:
            above += tl.sum((live & ((key & FOUND) > prefix) & (key != _HIGH_KEY)).to(tl.int32))
    return counts, above


@triton.jit
def _write_picks(x_row, out_row, lo, hi, threshold, take, ties_before, written, k, BLOCK: tl.constexpr):
    """Writes the picks of columns [lo, hi) in id order: keys above the threshold, and equal
    ones while fewer than `take` came before (ties_before); `written` picks precede them.
    Returns the picks written so far."""
    for start in range(lo, hi, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        live = cols < hi
        key = _keys(tl.load(x_row + cols, mask=live, other=0.0))
        tie = (live & (key == threshold)).to(tl.int32)
        tie_rank = ties_before + tl.cumsum(tie, 0) - tie
        returned = (key != _LOW_KEY) & (key != _HIGH_KEY)
        pick = (live & returned & ((key > threshold) | ((tie != 0) & (tie_rank < take)))).to(tl.int32)
        at_out = written + tl.cumsum(pick, 0) - pick
        # (< k always holds; the mask keeps a broken invariant from writing past the row)
        tl.store(out_row + at_out, cols.to(tl.int64), mask=(pick != 0) & (at_out < k))
        written += tl.sum(pick)
        ties_before += tl.sum(tie)
    return written


@triton.jit
def _pad(out_row, total, k, BLOCK: tl.constexpr):
    """-1 in the row's places from `total` on (fewer than k scores to return)."""
    for start in range(0, k, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        tl.store(out_row + cols, tl.full((BLOCK,), -1, tl.int64), mask=(cols >= total) & (cols < k))


@triton.jit
def _taken_threshold(threshold, take):
    """Keys equal to the threshold are picked only if it is a score's (-inf/NaN never are)."""
    return tl.where((threshold != _LOW_KEY) & (threshold != _HIGH_KEY), take, 0)


@triton.jit
def _count_kernel(x_ptr, hist_ptr, chunk_ptr, k, N, sxr, chunk_len,
                  PASS: tl.constexpr, LAST: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, chunk): counts by digit PASS the chunk's keys that match the digits found
    so far, into hist [passes, n, BINS]. LAST also writes the chunk's counts [n, chunks, BINS + 1]:
    at bin b, the keys above the threshold's other bits plus the matching ones with digit >= b."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    BINS: tl.constexpr = 1 << BITS
    bins = tl.arange(0, BINS)
    pass_stride = tl.num_programs(0) * BINS
    hist_row = hist_ptr + row * BINS
    prefix, _ = _found_digits(hist_row, pass_stride, k, PASS, BITS)
    lo = chunk * chunk_len
    counts, above = _digit_counts(x_ptr + row.to(tl.int64) * sxr, lo, tl.minimum(lo + chunk_len, N), prefix, PASS,
                                  LAST, BITS, BLOCK)
    tl.atomic_add(hist_row + PASS * pass_stride + bins, counts, sem="relaxed")
    if LAST:
        at = chunk_ptr + (row * tl.num_programs(1) + chunk) * (BINS + 1)
        tl.store(at + bins, tl.cumsum(counts, 0, reverse=True) + above)
        tl.store(at + BINS, above)


@triton.jit
def _write_kernel(x_ptr, hist_ptr, chunk_ptr, out_ptr, k, N, sxr, chunk_len, PASSES: tl.constexpr,
                  BITS: tl.constexpr, BLOCK: tl.constexpr, MAX_CHUNKS: tl.constexpr):
    """Program (row, chunk): writes the chunk's picks into out [n, k] at their ranks among the
    row's picks; chunk 0 also pads the row with -1."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    num_chunks = tl.num_programs(1)
    BINS: tl.constexpr = 1 << BITS
    threshold, take = _found_digits(hist_ptr + row * BINS, tl.num_programs(0) * BINS, k, PASSES, BITS)
    take = _taken_threshold(threshold, take)
    last_digit = (threshold & _digit_mask(PASSES - 1, BITS)).to(tl.int32)
    chunks = tl.arange(0, MAX_CHUNKS)
    at = chunk_ptr + (row * num_chunks + chunks) * (BINS + 1) + last_digit
    above_before = tl.sum(tl.load(at + 1, mask=chunks < chunk, other=0))
    ties_before = tl.sum(tl.load(at, mask=chunks < chunk, other=0)) - above_before
    written = above_before + tl.minimum(ties_before, take)
    out_row = out_ptr + row.to(tl.int64) * k
    lo = chunk * chunk_len
    _write_picks(x_ptr + row.to(tl.int64) * sxr, out_row, lo, tl.minimum(lo + chunk_len, N), threshold, take,
                 ties_before, written, k, BLOCK)
    if chunk == 0:
        _pad(out_row, tl.sum(tl.load(at + 1, mask=chunks < num_chunks, other=0)) + take, k, BLOCK)


@triton.jit
def _select_kernel(x_ptr, out_ptr, k, N, sxr, PASSES: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row): every counting pass and the writing one over the whole row, the counts
    in registers: one launch where the chunked form takes PASSES + 2 (a decode step's rows
    are short, and each launch costs the host more than the GPU work)."""
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * sxr
    out_row = out_ptr + row.to(tl.int64) * k
    threshold = tl.zeros((), tl.uint32)
    take = k
    for p in tl.static_range(PASSES):
        counts, _ = _digit_counts(x_row, 0, N, threshold, p, False, BITS, BLOCK)
        threshold, take = _take_digit(counts, threshold, take, p, BITS)
    none = tl.zeros((), tl.int32)  # (running counts: tensors from the start, as the loops carry them)
    written = _write_picks(x_row, out_row, 0, N, threshold, _taken_threshold(threshold, take), none, none, k, BLOCK)
    _pad(out_row, written, k, BLOCK)


def top_k_ascending_kernel(scores: torch.Tensor, k: int, chunks: int | None = None, block: int = _BLOCK,
                           radix_bits: int = RADIX_BITS) -> torch.Tensor:
    """top_k_ascending_ref by the kernels, on any device they run on (the CPU interpreter in
    tests). chunks (per row) and block override the launch plan, for tests; radix_bits (4 to 11)
    trades passes for bins."""
    n, N = scores.shape
    assert k <= N, f"k = {k} > {N} scores"
    out = torch.empty(n, max(k, 0), dtype=torch.long, device=scores.device)
    if k <= 0 or n == 0:
        return out
    assert 4 <= radix_bits <= 11  # 8 to 3 counting passes
    x = scores.float()
    if x.stride(-1) != 1:
        x = x.contiguous()
    if chunks is None:
        chunks = max(1, min(triton.cdiv(N, _MIN_CHUNK), triton.cdiv(_PROGRAMS, n)))
    passes = triton.cdiv(32, radix_bits)
    if chunks == 1:  # one program per row: every pass in one launch
        _select_kernel[(n,)](x, out, k, N, x.stride(0), PASSES=passes, BITS=radix_bits, BLOCK=block, num_warps=8)
        return out
    chunk_len = triton.cdiv(triton.cdiv(N, chunks), block) * block
    hist = torch.zeros(passes, n, 1 << radix_bits, dtype=torch.int32, device=x.device)
    chunk_counts = torch.empty(n, chunks, (1 << radix_bits) + 1, dtype=torch.int32, device=x.device)
    grid = (n, chunks)
    for p in range(passes):
        _count_kernel[grid](x, hist, chunk_counts, k, N, x.stride(0), chunk_len, PASS=p, LAST=p == passes - 1,
                            BITS=radix_bits, BLOCK=block, num_warps=8)
    _write_kernel[grid](x, hist, chunk_counts, out, k, N, x.stride(0), chunk_len, PASSES=passes, BITS=radix_bits,
                        BLOCK=block, MAX_CHUNKS=triton.next_power_of_2(chunks), num_warps=8)
    return out
