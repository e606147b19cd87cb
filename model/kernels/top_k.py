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

Long rows (at least FILTER_SHARE times k scores: a long prefill's slices of 128 queries by
1M entries, decode at long context; PREFILL_FILTER_SHARE times k in launches of many rows)
are filtered first, so the passes read a few thousand scores a row instead of the row five
times: one program a row takes the floor, the rank-th best key of SAMPLE scores spread over
the row (floor_rank: about four times the sample's share of the k best); one launch keeps,
per chunk, the scores whose keys reach it (CAPACITY places a chunk); one program a row runs
the radix select over the kept scores of all its chunks at once (their order does not
matter: ties are settled by their ids). The
kept scores hold the row's k best whenever every chunk's fit their places and there are at
least k (or the floor let every returnable score through). Where not (the sample misjudged
the row: rare), that program selects over the whole row instead: slow, never wrong. Three
launches, no host sync.

Cost: for sm_90, Triton 3.9 compiles tl.histogram to one shared-memory atomic add per
counted score (masked ones branch around it), so a pass costs a few instructions per score
plus the waits where a warp's scores hit the same bin: most in the first pass, whose digit is
the sign and exponent bits where scores bunch; later passes count only the scores matching the
digits found so far. Wider digits mean fewer passes, each one reading the scores once, and
more bins to clear and sum per step (radix_bits; bench/h200.py times 11, 8 and 6).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import pdl
from .common import interpreting, sm_count
from .compile_threads import launch_all

RADIX_BITS = 8  # 4 counting passes of 256 bins (see Cost above)
_BLOCK = 2048  # elements per step of a program
_PROGRAMS = 1024  # what a launch aims for: a few per SM, to keep loads in flight
_MIN_CHUNK = 8 * _BLOCK  # a chunk also re-derives the digits and reads the chunk counts: not too short
# The filtered form (module doc): a floor from SAMPLE scores a row keeps 4k + N/256 of them
# on average (6,144 at k = 512 of 1M). H200, 2026-12-01 (bench/top_k_long_rows.py), indexer
# scores: 128 x 1M, k = 512: 0.59 ms against the radix select's 3.42 (256 x 512K alike); 6 x 1M
# (decode): 0.12 against 0.19; 48 x 128K, k = 2048: 0.22 against 0.19, so rows shorter than
# 128 k stay unfiltered.
FILTER_SHARE = 128  # rows of at least 128 k scores are filtered
# ... and from 32 k in launches of many rows (a prefill chunk's score slices at contexts under
# 256K tokens: a slice of 2^27 scores is 2,048 to 8,192 rows there), where the radix select's
# one program a row reads each row five times. H100, forty-ninth session (bench/
# top_k_long_rows.py --shapes), k = 512, radix against filtered: 16,384 x 8,191 3,334 against
# 5,510 us (the pick's ~2K kept a row: left unfiltered), 8,192 x 16,383 3,231 against 2,168,
# 4,096 x 32,767 3,420 against 1,108, 2,048 x 65,535 3,519 against 749; the same picks.
# Decode's few rows keep FILTER_SHARE (48 x 128K at k = 2,048: 0.22 ms filtered, 0.19 not).
PREFILL_FILTER_SHARE, PREFILL_FILTER_ROWS = 32, 1024
SAMPLE = 4096
# The sample's scores come in runs of SAMPLE_RUN consecutive ids (SAMPLE / SAMPLE_RUN runs
# spread evenly; 1: each id on its own). One at a time, each sampled score took a memory
# sector of its own: 4,096 x 32 B a row, the whole row at 16K entries. H100, seventieth
# session (call CD): the floor's launch 85 us at 512 rows of 256K (a 1M prompt's last slices),
# 521 at 8,192 rows of 16K (its early chunks) where torch's amax read the whole slice in 189,
# and counting its sample by other means changed nothing at long rows: the reads, not the select,
# take its time. A run of 8 fills a 32-byte sector. Only the floor changes (the kept scores
# around it, never the ids: any floor gives the k best). H100, seventy-second session (calls
# CG and CF), runs of 1 against 8: the floor at 512 x 256K 86.7 against 45.5 us (the whole
# filtered top-k 396 against 367), at 2,048 x 64K 194 against 141 (743 against 694), at 8,192
# x 16K and at decode's 6 rows of 1M alike; a 1M prompt in one process 45.40 | 44.57 | 44.79 |
# 44.76 s at 1 | 8 | 1 | 8, the same last logits.
SAMPLE_RUN = 8
FLOOR_MARGIN, FLOOR_SLACK = 4, 16
CAPACITY = 8192  # kept scores a chunk has places for, at most (places: no more than its scores)
# The filtering launch: 4 warps and loads 3 steps ahead (tl.range stages) took 0.59 ms where 8
# warps and none took 0.86 (128 x 1M). It is bound by issue, not bytes: 4 warps keep up with
# HBM at ~32 instructions a score, and its loop took ~56 (449 a thread for 8 scores, sm_90 SASS,
# bench/kernel_resources.py --kernel top_k_filter). Since the forty-fourth session it compares
# _signed_keys with the floor (2 instructions a score where _keys took ~9) and keeps each
# lane's highest kept key, reduced once after the loop: 331 (56 registers), the same kept
# scores (a test over special values and floors). Untimed.
FILTER_STAGES, FILTER_WARPS = 3, 4
# The filtering launch's atomic plan keeps each score in PTX (_keep_ptx, as the score tiles'
# epilogue does with indexer.KEEP_IN_SCORES): a branch a score around the rare kept ones, where
# Triton's ops make every score's place and addresses. For sm_90 the hot path is ~8 issued
# instructions a score (~41 in Triton's form, past the ~32 at which 4 warps keep up with HBM),
# 32 registers where there were 56 (forty-fifth session; the interpreter runs Triton's form).
# H100, forty-sixth session, the filtered top-k against Triton's form (bench/top_k_long_rows.py,
# k 512): 128 x 1M 356 against 368 us, 512 x 256K 397 against 435, 256 x 512K 455 against 431,
# 48 x 128K (k 2,048) 282 against 313; with the FP8 score slice before it (bench/
# keep_in_scores.py) 128 x 1M 1,515 against 1,532 us, 512 x 256K 1,541 against 1,585. Its GPU
# test picks what Triton's form picks.
FILTER_PTX = True
# The filtering launch's programs an SM (0: a program each (row, chunk), 4,096 for a 128 x 1M
# slice, which fill the SMs until they are done). 1: one an SM, each taking (row, chunk) pairs
# in turn: beside the next slice's score tiles (three programs an SM at
# indexer_score.TALL_FP8_MAXNREG 160) it can then run on every SM at once. sm_90 SASS (PTX
# form): 32 registers either way, the loop 431 instructions in turn against 308. H100,
# fifty-fifth session (call AJ), a 512K faithful prefill in 16K chunks: 27.70 s with it (and
# 160 registers) against 21.21-22.09 s without, a late chunk 0.89 against 0.72 s: one program
# an SM filters a slice far slower than the scores it was to hide under. Stays 0.
FILTER_PROGRAMS = 0


class FilterPlan(NamedTuple):
    """The filtered form's launches for a number of rows."""
    chunks: int  # programs a row
    atomic: bool  # kept scores take places from an atomic count (any order), not a prefix sum per block
    block: int  # scores a step of the filtering and picking programs


# Two plans, so two compiles of the pick (each several seconds, which a long prompt paid
# mid-way, at each new chunk count, until warm_up ran at start): one where rows are many
# (prefill slices), one where few (decode). H200, 2026-12-02, seventeenth session
# (bench/top_k_long_rows.py, three calls), k = 512. 256 x 512K: 8 chunks a row, 2,048-score
# blocks, 629 and 616 us with prefix sums, 414 and 416 atomic; atomic in 32 chunks 368 and 367,
# in 1,024-score blocks 338. 512 x 256K (a 1M prompt's last slices): 8 chunks 624, 32 chunks
# 459, in 1,024-score blocks 386. 6 x 1M, 64 chunks: 2,048-score blocks 203, 128, 126 us;
# 1,024-score blocks 123, 116 to 138; atomic 215, 138, 131.
FILTER_PLANS = {"many rows": FilterPlan(32, True, 1024), "few rows": FilterPlan(64, False, 1024)}
MANY_ROWS = 32
# The pick reads its row's kept scores as tiles of PICK_TILE places (every chunk's next
# PICK_TILE / chunks), once for each counting pass, the ties' count and the writing pass (a
# decode row keeps ~3K scores). H200, 2026-12-04 (bench/top_k_decode.py, 6 x 262,144): the
# whole top-k 62 us at 1,024 places, 60 at 4,096, 67 at 8,192 (58 on 16 warps); 48 rows 85,
# 89, 132: the tiles' loads are not what a pick waits on.
PICK_TILE, PICK_WARPS = 1024, 8
# The pick skips the counting passes whose digits every kept key shares: kept keys lie between
# the row's floor and the highest one kept, so where those two agree in a pass's digit (and in
# every digit above it) that digit is the threshold's, with no keys above it, and counting it
# would only put every key in one bin. H200, 2026-12-04 (bench/top_k_decode.py, 262,144
# entries): the pick 36.2 -> 34.4 us at 6 rows, 38.6 -> 34.2 at 48.
PICK_SKIPS_SHARED_DIGITS = True


def filter_plan(n: int) -> FilterPlan:
    return FILTER_PLANS["many rows" if n >= MANY_ROWS else "few rows"]


_NEG_INF_KEY = tl.constexpr(0x007FFFFF)  # key of -inf; NaNs with the sign bit set lie below it
_POS_INF_KEY = tl.constexpr(0xFF800000)  # key of +inf; NaNs without it lie above
_LOW_KEY = tl.constexpr(0)  # -inf and negative NaNs: ranked last, never returned
_HIGH_KEY = tl.constexpr(0xFFFFFFFF)  # positive NaNs: ranked first, never returned
_NO_TOP = tl.constexpr(-2147483648)  # a chunk's highest kept signed key where it kept none (no kept key is it)


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
def _fixed_through(pass_: int, bits: int) -> int:
    """The bits that passes up to and including `pass_` fix (uint32)."""
    return (0xFFFFFFFF << _digit_shift(pass_, bits)) & 0xFFFFFFFF


@triton.constexpr_function
def _found_mask(pass_: int, bits: int) -> int:
    """The bits that passes before `pass_` have fixed (uint32)."""
    return _fixed_through(pass_ - 1, bits) if pass_ else 0


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
def _signed_keys(x):
    """fp32 scores -> int32 keys in the scores' order, without _keys' collapses, in 2
    instructions a score where _keys takes ~9: negatives' magnitude bits flipped, so -0.0 lands
    at -1 just below +0.0, -inf below every finite score, negative NaNs below it and positive
    NaNs above +inf. key ^ 0x80000000 is _keys' key wherever _keys collapses nothing."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _signed_floor(floor):
    """A floor of _keys' keys (uint32, at least 1) -> the least _signed_keys key that reaches
    it: a score's _keys key is >= floor iff its signed key is >= this. A floor among the
    collapsed keys (0: -inf and negative NaNs; 0xFFFFFFFF: positive NaNs) goes to the end of
    the finite scores beside it, and one at 0.0 takes -0.0 (signed -1) in too."""
    t = (tl.minimum(tl.maximum(floor, 0x00800000), 0xFF800001) ^ 0x80000000).to(tl.int32, bitcast=True)
    return tl.where(t == 0, -1, t)


@triton.jit
def _top_key(signed):
    """The highest kept score's _signed_keys key (_NO_TOP: none kept) -> its _keys key (0: none).
    (_collapsed_key keeps the keys' order, so the highest signed key gives the highest key.)"""
    return tl.where(signed == _NO_TOP, 0, _collapsed_key(signed))


@triton.jit
def _collapsed_key(signed):
    """A kept score's _signed_keys key -> its _keys key (-0.0 as 0.0, positive NaNs as _HIGH_KEY)."""
    key = signed.to(tl.uint32, bitcast=True) ^ 0x80000000
    key = tl.where(signed == -1, 0x80000000, key)
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
def _digit_histogram(key, live, prefix, PASS: tl.constexpr, BITS: tl.constexpr):
    """Counts by digit PASS of the live keys (1-D) that match the digits found so far (prefix)."""
    digit = ((key >> _digit_shift(PASS, BITS)) & _digit_mask(PASS, BITS)).to(tl.int32)
    if PASS == 0:
        return tl.histogram(digit, 1 << BITS, mask=live)
    return tl.histogram(digit, 1 << BITS, mask=live & ((key & _found_mask(PASS, BITS)) == prefix))


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
        counts += _digit_histogram(key, live, prefix, PASS, BITS)
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
                  PASS: tl.constexpr, LAST: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program (row, chunk): counts by digit PASS the chunk's keys that match the digits found
    so far, into hist [passes, n, BINS]. LAST also writes the chunk's counts [n, chunks, BINS + 1]:
    at bin b, the keys above the threshold's other bits plus the matching ones with digit >= b."""
    pdl.wait_for_inputs(PDL)
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
                  BITS: tl.constexpr, BLOCK: tl.constexpr, MAX_CHUNKS: tl.constexpr, PDL: tl.constexpr):
    """Program (row, chunk): writes the chunk's picks into out [n, k] at their ranks among the
    row's picks; chunk 0 also pads the row with -1."""
    pdl.wait_for_inputs(PDL)
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
def _select_row(x_row, out_row, k, N, PASSES: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Every counting pass and the writing one over a whole row, in one program, the counts in
    registers."""
    threshold = tl.zeros((), tl.uint32)
    take = k
    for p in tl.static_range(PASSES):
        counts, _ = _digit_counts(x_row, 0, N, threshold, p, False, BITS, BLOCK)
        threshold, take = _take_digit(counts, threshold, take, p, BITS)
    none = tl.zeros((), tl.int32)  # (running counts: tensors from the start, as the loops carry them)
    written = _write_picks(x_row, out_row, 0, N, threshold, _taken_threshold(threshold, take), none, none, k, BLOCK)
    _pad(out_row, written, k, BLOCK)


@triton.jit
def _select_kernel(x_ptr, out_ptr, k, N, sxr, PASSES: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr):
    """Program (row): _select_row, one launch where the chunked form takes PASSES + 2 (a
    decode step's rows are short, and each launch costs the host more than the GPU work)."""
    pdl.wait_for_inputs(PDL)
    row = tl.program_id(0)
    _select_row(x_ptr + row.to(tl.int64) * sxr, out_ptr + row.to(tl.int64) * k, k, N, PASSES, BITS, BLOCK)


# (Integer arguments are not specialized on (divisibility by 16 and the like): every row
# length then takes the kernels warm_up compiled.)
@triton.jit(do_not_specialize=["N", "sxr", "rank"])
def _sample_floor_kernel(x_ptr, floor_ptr, N, sxr, rank, SAMPLE: tl.constexpr, PASSES: tl.constexpr,
                         BITS: tl.constexpr, PDL: tl.constexpr, RUN: tl.constexpr = 1):
    """Program (row): the rank-th best key of SAMPLE scores spread evenly over the row in runs
    of RUN (sample_columns), by the radix select on registers: the row's floor (_filter_kernel)."""
    pdl.wait_for_inputs(PDL)
    row = tl.program_id(0)
    j = tl.arange(0, SAMPLE)
    cols = tl.minimum((j // RUN).to(tl.int64) * N // (SAMPLE // RUN) + j % RUN, N - 1)
    key = _keys(tl.load(x_ptr + row.to(tl.int64) * sxr + cols))
    floor = tl.zeros((), tl.uint32)
    rest = rank
    for p in tl.static_range(PASSES):
        floor, rest = _take_digit(_digit_histogram(key, key == key, floor, p, BITS), floor, rest, p, BITS)
    tl.store(floor_ptr + row, floor.to(tl.int32, bitcast=True))


@triton.jit
def _floor(floor_ptr, row):
    """A row's floor key (stored as int32 bits)."""
    return tl.load(floor_ptr + row).to(tl.uint32, bitcast=True)


# _filter_kernel's chunk and pair counts only bound IN_TURN's loop: unspecialized, or a 1M
# prompt's slices (their rows and chunks divisible by 16 or not) compiled 11 variants inside its
# first prefill that the warm-up had not (H100, fifty-seventh session, call AT: 1.6 s of
# compiles; 47.24 s against 45.95 for the same prefill next in that process)
FILTER_UNSPECIALIZED = ("chunks", "pairs")


@triton.jit(do_not_specialize=FILTER_UNSPECIALIZED)
def _filter_kernel(x_ptr, floor_ptr, kept_ptr, id_ptr, count_ptr, top_ptr, N, sxr, chunk_len, chunks, pairs,
                   CAPACITY: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr, ATOMIC: tl.constexpr,
                   PDL: tl.constexpr, PTX: tl.constexpr = False, IN_TURN: tl.constexpr = False):
    """Each (row, chunk) of the `pairs` = rows x `chunks`, a program each, or with IN_TURN
    taken in turn by fewer programs (FILTER_PROGRAMS): the chunk's scores whose keys reach the
    row's floor (and are not -inf or a negative NaN, which are never returned), with their ids,
    into the chunk's CAPACITY places; how many there are (all of them, also past CAPACITY) and
    the highest signed key among them (_NO_TOP where none). Their places come
    from a prefix sum over each block (in id order), or with ATOMIC from an atomic count the
    kept scores take places from one by one (in any order; the count starts at 0): a few in a
    block of thousands, where the prefix sum costs every score. PTX (with ATOMIC, on the GPU):
    each score kept as the score tiles keep theirs (_keep_ptx: a branch a score around the rare
    kept ones; the top taken by an atomic max, so the tops start at _NO_TOP)."""
    pdl.wait_for_inputs(PDL)
    if IN_TURN:  # grid (programs, 1)
        for pair in range(tl.program_id(0), pairs, tl.num_programs(0)):
            at = pair + tl.zeros((), tl.int32)  # (a tensor in the interpreter too)
            _filter_pair(at // chunks, at % chunks, at, x_ptr, floor_ptr, kept_ptr, id_ptr, count_ptr, top_ptr, N,
                         sxr, chunk_len, CAPACITY, BLOCK, STAGES, ATOMIC, PTX)
    else:  # grid (rows, chunks), a program a pair
        row, chunk = tl.program_id(0), tl.program_id(1)
        _filter_pair(row, chunk, row * tl.num_programs(1) + chunk, x_ptr, floor_ptr, kept_ptr, id_ptr, count_ptr,
                     top_ptr, N, sxr, chunk_len, CAPACITY, BLOCK, STAGES, ATOMIC, PTX)


@triton.jit
def _filter_pair(row, chunk, at, x_ptr, floor_ptr, kept_ptr, id_ptr, count_ptr, top_ptr, N, sxr, chunk_len,
                 CAPACITY: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr, ATOMIC: tl.constexpr,
                 PTX: tl.constexpr):
    """_filter_kernel's work for one (row, chunk), the at-th pair."""
    floor = _signed_floor(tl.maximum(_floor(floor_ptr, row), _LOW_KEY + 1))
    x_row = x_ptr + row.to(tl.int64) * sxr
    kept_at, id_at = kept_ptr + at.to(tl.int64) * CAPACITY, id_ptr + at.to(tl.int64) * CAPACITY
    kept = tl.zeros((), tl.int32)
    tops = tl.full((BLOCK,), _NO_TOP, tl.int32)  # each lane's highest kept signed key
    lo = chunk * chunk_len
    hi = tl.minimum(lo + chunk_len, N)
    for start in tl.range(lo, hi, BLOCK, num_stages=STAGES):
        cols = start + tl.arange(0, BLOCK)
        score = tl.load(x_row + cols, mask=cols < hi, other=float("-inf"))
        if PTX:
            _keep_ptx(score, floor, (count_ptr + at).to(tl.int64, bitcast=True),
                      (top_ptr + at).to(tl.int64, bitcast=True), kept_at.to(tl.int64, bitcast=True),
                      id_at.to(tl.int64, bitcast=True), CAPACITY, cols)
        else:
            key = _signed_keys(score)
            keep = (key >= floor).to(tl.int32)
            tops = tl.maximum(tops, tl.where(keep != 0, key, _NO_TOP))
            if ATOMIC:
                place = tl.atomic_add(count_ptr + at + tl.zeros_like(cols), 1, mask=keep != 0, sem="relaxed")
            else:
                place = kept + tl.cumsum(keep, 0) - keep
                kept += tl.sum(keep)
            room = (keep != 0) & (place < CAPACITY)
            tl.store(kept_at + place, score, mask=room)
            tl.store(id_at + place, cols, mask=room)
    if not ATOMIC:
        tl.store(count_ptr + at, kept)
    if not PTX:  # (the PTX form took the top by atomic max)
        tl.store(top_ptr + at, tl.max(tops))


# A score's keep in PTX (one score an asm; labels made unique by LLVM's ${:uid}): its signed key
# against the row's signed floor, and only where it reaches it (rare: ~1% of a long row) a place
# from the chunk's count, its highest key, and the score and its id stored where the place fits.
_KEEP_PTX = tl.constexpr("""{
.reg .pred p;
.reg .b32 k, s, place;
.reg .b64 a;
mov.b32 $0, 0;
shr.s32 s, $1, 31;
and.b32 s, s, 0x7FFFFFFF;
xor.b32 k, $1, s;
setp.ge.s32 p, k, $2;
@!p bra SKIP${:uid};
atom.global.relaxed.gpu.add.u32 place, [$3], 1;
red.global.relaxed.gpu.max.s32 [$4], k;
setp.lt.u32 p, place, $7;
@!p bra SKIP${:uid};
mul.wide.u32 a, place, 4;
add.s64 a, a, $5;
st.global.b32 [a], $1;
mul.wide.u32 a, place, 4;
add.s64 a, a, $6;
st.global.b32 [a], $8;
mov.b32 $0, 1;
SKIP${:uid}:
}""")


@triton.jit
def _keep_ptx(scores, floor, counts_at, tops_at, kept_at, ids_at, capacity, cols):
    """keep_tile's work in PTX: a per-thread branch around the rare kept scores (Triton's form
    computes every score's places and addresses). Returns 1 where a score was stored."""
    return tl.inline_asm_elementwise(_KEEP_PTX, "=r,r,r,l,l,l,l,r,r",
                                     [scores.to(tl.int32, bitcast=True), floor, counts_at, tops_at, kept_at, ids_at,
                                      capacity, cols], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def keep_tile(scores, rows, live_rows, cols, chunk, floor_ptr, kept_ptr, id_ptr, count_ptr, top_ptr, chunks, capacity,
              PTX: tl.constexpr = False):
    """_filter_kernel's work for a tile of scores as they are made (the indexer's score tiles'
    epilogue, KeptWork): scores [R, C] of top-k rows `rows` [R] (live_rows: which are rows) at
    ids `cols` [C], all in chunk `chunk` of their rows; the scores reaching their row's floor
    take places from the chunks' atomic counts (counts zeroed first, tops _NO_TOP); rows not
    live_rows must score -inf (the score tiles' do), as their counts lie past the work. PTX (the
    GPU): a branch a score around the kept ones' work (_keep_ptx); for sm_90 this form costs
    the FP8 score tile's epilogue ~6 issued instructions a score and no registers, where
    Triton's computes every score's places and addresses (2,320 -> 4,752 SASS instructions a
    thread, 167 -> 255 registers with spills; 3,280 and 167 in PTX)."""
    floor = tl.load(floor_ptr + rows, mask=live_rows, other=0).to(tl.uint32, bitcast=True)
    floor = _signed_floor(tl.maximum(floor, _LOW_KEY + 1))
    at = rows * chunks + chunk  # each row's count and top; its places from at * capacity
    if PTX:
        places = at.to(tl.int64) * capacity
        _keep_ptx(scores, floor[:, None], (count_ptr + at).to(tl.int64, bitcast=True)[:, None],
                  (top_ptr + at).to(tl.int64, bitcast=True)[:, None],
                  (kept_ptr + places).to(tl.int64, bitcast=True)[:, None],
                  (id_ptr + places).to(tl.int64, bitcast=True)[:, None], capacity, cols[None, :])
    else:
        key = _signed_keys(scores)
        keep = (key >= floor[:, None]) & live_rows[:, None]
        place = tl.atomic_add(count_ptr + tl.broadcast_to(at[:, None], scores.shape), 1, mask=keep, sem="relaxed")
        spot = at.to(tl.int64)[:, None] * capacity + place
        room = keep & (place < capacity)
        tl.store(kept_ptr + spot, scores, mask=room)
        tl.store(id_ptr + spot, tl.broadcast_to(cols[None, :], scores.shape), mask=room)
        top = tl.max(tl.where(keep, key, _NO_TOP), axis=1)
        tl.atomic_max(top_ptr + at, top, mask=live_rows & (top != _NO_TOP), sem="relaxed")


@triton.jit
def _kept_tile(kept_ptr, id_ptr, count_ptr, row, chunks, j0, CHUNKS: tl.constexpr, J: tl.constexpr,
               CAPACITY: tl.constexpr):
    """Places j0 .. j0 + J of every chunk's kept scores, as one vector of CHUNKS * J (chunk
    c at c * J ..) -> (their keys, which hold one, their ids as uint32)."""
    e = tl.arange(0, CHUNKS * J)
    chunk = e // J
    place = j0 + e % J
    ours = chunk < chunks
    at = (row * chunks + chunk).to(tl.int64) * CAPACITY + place
    live = ours & (place < tl.load(count_ptr + row * chunks + chunk, mask=ours, other=0))
    key = _keys(tl.load(kept_ptr + at, mask=live, other=float("-inf")))
    return key, live, tl.load(id_ptr + at, mask=live, other=0).to(tl.uint32, bitcast=True)


@triton.jit(do_not_specialize=["k", "N", "sxr", "chunks"])
def _pick_kernel(x_ptr, floor_ptr, kept_ptr, id_ptr, count_ptr, top_ptr, out_ptr, k, N, sxr, chunks,
                 CAPACITY: tl.constexpr, PASSES: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
                 MAX_CHUNKS: tl.constexpr, J: tl.constexpr, K_POW2: tl.constexpr, SKIP_SHARED: tl.constexpr,
                 PDL: tl.constexpr):
    """Program (row): the radix select over the row's kept scores. They hold the row's k best
    when every chunk's fit its places and there are at least k of them, or when the floor let
    every returnable score through; otherwise (the sample misjudged the row) the whole row is
    selected in this program instead. The kept scores are read as tiles of every chunk's next
    J places (a row of many chunks, decode's, takes few steps), so they come out of id order:
    ties at the threshold are taken by a second radix select, over their ids (the lowest
    `take`), and the picks, written in any order, are sorted in registers at the end. With
    SKIP_SHARED, a counting pass whose digit the floor and the highest kept key share (and
    every digit above it) takes that digit without reading the kept scores."""
    pdl.wait_for_inputs(PDL)
    row = tl.program_id(0)
    out_row = out_ptr + row.to(tl.int64) * k
    chunk_ids = tl.arange(0, MAX_CHUNKS)
    counts = tl.load(count_ptr + row * chunks + chunk_ids, mask=chunk_ids < chunks, other=0)
    floor = tl.maximum(_floor(floor_ptr, row), _LOW_KEY + 1)  # every kept key is at least this
    everything = floor == _LOW_KEY + 1
    top = _top_key(tl.max(tl.load(top_ptr + row * chunks + chunk_ids, mask=chunk_ids < chunks, other=_NO_TOP)))
    longest = tl.max(counts)
    if (longest <= CAPACITY) & ((tl.sum(counts) >= k) | everything):
        threshold = tl.zeros((), tl.uint32)
        take = k
        for p in tl.static_range(PASSES):
            if SKIP_SHARED and ((floor ^ top) & _fixed_through(p, BITS)) == 0:
                threshold = threshold | (top & (_digit_mask(p, BITS) << _digit_shift(p, BITS)))
            else:
                bins = tl.zeros((1 << BITS,), tl.int32)
                for j0 in range(0, longest, J):
                    key, live, _ = _kept_tile(kept_ptr, id_ptr, count_ptr, row, chunks, j0, MAX_CHUNKS, J,
                                              CAPACITY)
                    bins += _digit_histogram(key, live, threshold, p, BITS)
                threshold, take = _take_digit(bins, threshold, take, p, BITS)
        take = _taken_threshold(threshold, take)
        ties = tl.zeros((), tl.int32)
        for j0 in range(0, longest, J):
            key, live, _ = _kept_tile(kept_ptr, id_ptr, count_ptr, row, chunks, j0, MAX_CHUNKS, J, CAPACITY)
            ties += tl.sum((live & (key == threshold)).to(tl.int32))
        last_tie = tl.full((), 0xFFFFFFFF, tl.uint32)  # the highest id of a tie taken: all of them
        if ties > take:  # the take-th lowest id of the ties is the (ties - take + 1)-th highest
            last_tie = tl.zeros((), tl.uint32)
            rest = ties - take + 1
            for p in tl.static_range(PASSES):
                bins = tl.zeros((1 << BITS,), tl.int32)
                for j0 in range(0, longest, J):
                    key, live, ids = _kept_tile(kept_ptr, id_ptr, count_ptr, row, chunks, j0, MAX_CHUNKS, J,
                                                CAPACITY)
                    bins += _digit_histogram(ids, live & (key == threshold), last_tie, p, BITS)
                last_tie, rest = _take_digit(bins, last_tie, rest, p, BITS)
        written = tl.zeros((), tl.int32)
        for j0 in range(0, longest, J):
            key, live, ids = _kept_tile(kept_ptr, id_ptr, count_ptr, row, chunks, j0, MAX_CHUNKS, J, CAPACITY)
            tie = (key == threshold) & (ids <= last_tie) & (take > 0)
            pick = (live & (key != _HIGH_KEY) & ((key > threshold) | tie)).to(tl.int32)
            place = written + tl.cumsum(pick, 0) - pick
            tl.store(out_row + place, ids.to(tl.int64), mask=(pick != 0) & (place < k))
            written += tl.sum(pick)
        tl.debug_barrier()  # every pick is stored before they are read back to be sorted
        places = tl.arange(0, K_POW2)
        picked = tl.load(out_row + places, mask=places < tl.minimum(written, k), other=0x7FFFFFFF).to(tl.int32)
        tl.store(out_row + places, tl.where(places < written, tl.sort(picked), -1).to(tl.int64), mask=places < k)
    else:
        _select_row(x_ptr + row.to(tl.int64) * sxr, out_row, k, N, PASSES, BITS, BLOCK)


def top_k_ascending_kernel(scores: torch.Tensor, k: int, chunks: int | None = None, block: int | None = None,
                           radix_bits: int = RADIX_BITS, filtered: bool | None = None, sample: int = SAMPLE,
                           capacity: int = CAPACITY) -> torch.Tensor:
    """top_k_ascending_ref by the kernels, on any device they run on (the CPU interpreter in
    tests). chunks (per row) and block override the launch plan, for tests; radix_bits (4 to 11)
    trades passes for bins; filtered (None: by the row length, see filters) takes the floor
    first, with `sample` scores a row and `capacity` places a chunk."""
    n, N = scores.shape
    assert k <= N, f"k = {k} > {N} scores"
    out = torch.empty(n, max(k, 0), dtype=torch.long, device=scores.device)
    if k <= 0 or n == 0:
        return out
    assert 4 <= radix_bits <= 11  # 8 to 3 counting passes
    x = scores.float()
    if x.stride(-1) != 1:
        x = x.contiguous()
    filtered, chunks, chunk_len, block = launch_plan(n, N, k, chunks, block, filtered)
    passes = triton.cdiv(32, radix_bits)
    if chunks == 1:  # one program per row: every pass in one launch
        _select_kernel[(n,)](x, out, k, N, x.stride(0), PASSES=passes, BITS=radix_bits, BLOCK=block, num_warps=8,
                             **pdl.options(x.device))
        return out
    grid = (n, chunks)
    if filtered:
        work = kept_work(n, N, k, x.device, chunks, block, capacity)  # (the same chunks: see launch_plan)
        filter_rows(x, k, work, sample, radix_bits)
        return pick_kept(x, k, work, radix_bits)
    hist = torch.zeros(passes, n, 1 << radix_bits, dtype=torch.int32, device=x.device)
    chunk_counts = torch.empty(n, chunks, (1 << radix_bits) + 1, dtype=torch.int32, device=x.device)
    for p in range(passes):
        _count_kernel[grid](x, hist, chunk_counts, k, N, x.stride(0), chunk_len, PASS=p, LAST=p == passes - 1,
                            BITS=radix_bits, BLOCK=block, num_warps=8, **pdl.options(x.device))
    _write_kernel[grid](x, hist, chunk_counts, out, k, N, x.stride(0), chunk_len, PASSES=passes, BITS=radix_bits,
                        BLOCK=block, MAX_CHUNKS=triton.next_power_of_2(chunks), num_warps=8, **pdl.options(x.device))
    return out


class KeptWork(NamedTuple):
    """The filtered form's work for n rows of N scores (launch_plan's chunks of chunk_len): each
    row's floor (a _keys key as int32 bits); a chunk's kept scores and their ids in `places`
    places ([n, chunks, places]), how many reached the floor (also past the places) and the
    highest signed key among them (_NO_TOP: none) ([n, chunks])."""
    floor: torch.Tensor
    kept: torch.Tensor
    ids: torch.Tensor
    counts: torch.Tensor
    tops: torch.Tensor
    chunk_len: int
    block: int  # scores a step of the pick's whole-row select
    atomic: bool  # the places come from atomic counts (counts zeroed), not from prefix sums

    @property
    def chunks(self) -> int:
        return self.counts.shape[1]


def kept_work(n: int, N: int, k: int, device: torch.device, chunks: int | None = None, block: int | None = None,
              capacity: int | None = None, atomic: bool | None = None, floor: torch.Tensor | None = None) -> KeptWork:
    """The filtered form's work buffers for n rows of N scores (launch_plan, places of at most
    `capacity`, CAPACITY unless given; atomic: the plan's unless given), with the rows' floors
    where they are taken already (sample_floors)."""
    _, chunks, chunk_len, block = launch_plan(n, N, k, chunks, block, filtered=True)
    width = places(chunk_len, CAPACITY if capacity is None else capacity)
    atomic = filter_plan(n).atomic if atomic is None else atomic
    assert floor is None or floor.shape == (n,) and floor.dtype == torch.int32
    if floor is None:
        floor = torch.empty(n, dtype=torch.int32, device=device)
    elif floor.data_ptr() % 16:  # (a slice of a run's floors: Triton compiles again for pointers off 16 bytes)
        floor = floor.clone()
    return KeptWork(floor,
                    torch.empty(n, chunks, width, dtype=torch.float32, device=device),
                    torch.empty(n, chunks, width, dtype=torch.int32, device=device),
                    (torch.zeros if atomic else torch.empty)(n, chunks, dtype=torch.int32, device=device),
                    torch.full((n, chunks), _NO_TOP.value, dtype=torch.int32, device=device), chunk_len, block, atomic)


def sample_columns(N: int, device: torch.device, sample: int | None = None) -> torch.Tensor:
    """The ids whose scores the filtered form's floor is taken from: `sample` (SAMPLE unless
    given) of them spread evenly over a row of N in runs of sample_run(sample) consecutive ids
    (_sample_floor_kernel's)."""
    sample = SAMPLE if sample is None else sample
    run = sample_run(sample)
    j = torch.arange(sample, device=device)
    return ((j // run) * N // (sample // run) + j % run).clamp(max=N - 1)


def sample_run(sample: int) -> int:
    """Consecutive ids a run of the floor's sample of `sample` takes: SAMPLE_RUN, or where that
    does not divide the sample, the largest number that divides both."""
    return math.gcd(SAMPLE_RUN, sample)


def sample_floors(scores: torch.Tensor, k: int, N: int, out: torch.Tensor | None = None, sample: int | None = None,
                  radix_bits: int = RADIX_BITS) -> torch.Tensor:
    """Each row's floor [n] (int32 bits of a _keys key) for rows of N scores, into `out` if
    given, from `sample` of scores [n, W] spread evenly over its W columns: a whole row's
    (filter_rows), or by default all W of rows that hold its scores at sample_columns(N, W)
    already (rows whose kept scores are then filled where they are made: keep_tile)."""
    n, width = scores.shape
    sample = width if sample is None else sample
    out = torch.empty(n, dtype=torch.int32, device=scores.device) if out is None else out
    if n:
        _sample_floor_kernel[(n,)](scores, out, width, scores.stride(0), floor_rank(k, N, sample), SAMPLE=sample,
                                   PASSES=triton.cdiv(32, radix_bits), BITS=radix_bits, RUN=sample_run(sample),
                                   num_warps=8, **pdl.options(scores.device))
    return out


def filter_rows(x: torch.Tensor, k: int, work: KeptWork, sample: int = SAMPLE, radix_bits: int = RADIX_BITS) -> None:
    """The filtered form's first two launches over rows x [n, N]: each row's floor from `sample`
    of its scores, then each chunk's scores reaching it into `work` (FILTER_PTX: in PTX where
    the places are atomic, on the GPU)."""
    n, N = x.shape
    sample_floors(x, k, N, work.floor, sample, radix_bits)
    pairs = n * work.chunks
    programs = min(pairs, FILTER_PROGRAMS * sm_count(x.device)) if FILTER_PROGRAMS else pairs
    in_turn = programs < pairs
    _filter_kernel[(programs, 1) if in_turn else (n, work.chunks)](
        x, work.floor, work.kept, work.ids, work.counts, work.tops, N, x.stride(0), work.chunk_len, work.chunks, pairs,
        CAPACITY=work.kept.shape[-1], BLOCK=work.block, STAGES=FILTER_STAGES, ATOMIC=work.atomic,
        PTX=FILTER_PTX and work.atomic and not interpreting(), IN_TURN=in_turn, num_warps=FILTER_WARPS,
        **pdl.options(x.device))


def pick_kept(x: torch.Tensor, k: int, work: KeptWork, radix_bits: int = RADIX_BITS) -> torch.Tensor:
    """The filtered form's last launch: each row's k best ids from its kept scores (work), or
    from its whole row of x [n, N] where they do not hold them."""
    n, N = x.shape
    out = torch.empty(n, k, dtype=torch.long, device=x.device)
    most = pick_chunks(n, work.chunks)
    _pick_kernel[(n,)](x, work.floor, work.kept, work.ids, work.counts, work.tops, out, k, N, x.stride(0),
                       work.chunks, CAPACITY=work.kept.shape[-1], PASSES=triton.cdiv(32, radix_bits), BITS=radix_bits,
                       BLOCK=work.block, MAX_CHUNKS=most, J=max(PICK_TILE // most, 16),
                       K_POW2=triton.next_power_of_2(k), SKIP_SHARED=PICK_SKIPS_SHARED_DIGITS,
                       num_warps=PICK_WARPS, **pdl.options(x.device))
    return out


def launch_plan(n: int, N: int, k: int, chunks: int | None = None, block: int | None = None,
                filtered: bool | None = None) -> tuple[bool, int, int, int]:
    """(filtered, chunks a row, chunk length, scores a step) for n rows of N scores; chunks,
    block and filtered override the choice (tests)."""
    filtered = filters(k, N, n) if filtered is None else filtered
    if chunks is None and filtered:
        chunks = filter_plan(n).chunks
    elif chunks is None:
        chunks = max(1, min(triton.cdiv(N, _MIN_CHUNK), triton.cdiv(_PROGRAMS, n)))
    block = block or (filter_plan(n).block if filtered else _BLOCK)
    chunk_len = triton.cdiv(triton.cdiv(N, chunks), block) * block
    # (rounding the length up may leave fewer chunks)
    return filtered, triton.cdiv(N, chunk_len), chunk_len, block


def pick_chunks(n: int, chunks: int) -> int:
    """The pick kernel's MAX_CHUNKS (a constexpr) for n rows of `chunks` chunks: the plan's own
    count (FILTER_PLANS) even where a short row's rounded chunk length leaves fewer, so that
    rows of every length take one of its two compiles."""
    return max(triton.next_power_of_2(chunks), filter_plan(n).chunks)


def places(chunk_len: int, capacity: int = CAPACITY) -> int:
    """Kept-score places a chunk of chunk_len scores takes in the filtered form: `capacity`, or
    the power of two that holds all its scores where that is fewer (a power of two: a few
    compiles of the kernels, which take it as a constant). The work buffers are [rows, chunks,
    places]: at 8,192 places whatever the row length, an indexer slice of 2,048 rows of 65,536
    scores took 4 GiB (1 GiB now; at most 1.7, 1,008 rows of 133,121) and the tiny
    checkpoint's (k = 4) up to 8 GiB."""
    return min(capacity, triton.next_power_of_2(chunk_len))


def work_bytes(n: int, N: int, k: int) -> int:
    """The filtered form's work buffers for n rows of N scores (kept scores and their ids), 0
    where the rows take another form."""
    filtered, chunks, chunk_len, _ = launch_plan(n, N, k)
    return n * chunks * places(chunk_len) * 8 if filtered else 0


def filtered_lengths(k: int, most: int, n: int = PREFILL_FILTER_ROWS) -> list[int]:
    """Row lengths from the first that launches of n rows filter (filter_share) to `most` at
    each multiple of a block, and one past each (not divisible by 16): every variant the
    filtered form compiles, and its work, changes only between them (places follow the chunk
    length, a multiple of the block)."""
    first = filter_share(n) * k
    step = min(plan.block for plan in FILTER_PLANS.values())
    blocks = range(-(-first // step) * step, most + 1, step)
    lengths = {first, first + 1, most} | {n + d for n in blocks for d in (0, 1)}
    return sorted(n for n in lengths if first <= n <= most)


def filter_share(n: int) -> int:
    """Scores a row, in multiples of k, from which launches of n rows filter."""
    return PREFILL_FILTER_SHARE if n >= PREFILL_FILTER_ROWS else FILTER_SHARE


def filters(k: int, N: int, n: int = 1) -> bool:
    """Whether n rows of N scores take the floor first: the k best are a small share of them."""
    return N >= filter_share(n) * k and k <= 4096  # (the picks are sorted in one program's registers)


def warm_up_rows(longest: dict[int, int]) -> list[tuple[int, int, int, int | None, bool | None]]:
    """(rows, row length, k, chunks, filtered) of the launches warm_up makes, for rows of up to
    longest[k] scores at each k: the one-program select, the radix select's chunked kernels at
    each power of two of chunks a row below the filtered form's rows (its write kernel compiles
    once per power), each at row lengths divisible by 16 and not (the kernels specialize on it),
    and where rows reach it the filtered form's two plans (None: its own choice) at each number
    of places (`places`) their row lengths meet, likewise."""
    launches = []
    for k, most in sorted(longest.items()):
        radix_most = min(most, filter_share(1) * k - 1) if k <= 4096 else most
        chunks = 1
        while chunks == 1 or (chunks // 2) * _MIN_CHUNK < radix_most:
            N = max(chunks * _MIN_CHUNK, k + 1)
            launches += [(1, N, k, chunks, False), (1, N - 1, k, chunks, False)]
            chunks *= 2
        if filters(k, most, PREFILL_FILTER_ROWS):
            launches += _filtered_warm_up(k, most)
    return launches


def _filtered_warm_up(k: int, most: int) -> list[tuple[int, int, int, None, bool]]:
    """The filtered form's launches for rows from the first filtered length to `most` scores:
    one a plan, number of places and divisibility by 16 (the compiled variants) of
    filtered_lengths, the many rows' plan from the prefill slices' first length (on MANY_ROWS
    rows: the same compiles as PREFILL_FILTER_ROWS'), the few rows' from decode's."""
    launches, seen = [], set()
    for rows, lengths in ((MANY_ROWS, filtered_lengths(k, most)), (1, filtered_lengths(k, most, 1))):
        for N in lengths:
            _, chunks, chunk_len, block = launch_plan(rows, N, k, filtered=True)
            key = (pick_chunks(rows, chunks), block, places(chunk_len), N % 16 == 0)
            if key not in seen:
                seen.add(key)
                launches.append((rows, N, k, None, True))
    return launches


def warm_up(device: torch.device, longest: dict[int, int]) -> None:
    """Compile the top-k's kernels for every plan rows of up to longest[k] scores meet (a
    worker's indexer: indexer.top_k_rows) now, before the worker serves, instead of inside its
    first long prompts. H200, 2026-12-02, empty Triton cache: 27.4 s one after another; a
    decode row of 100,001 scores then still compiled its filtering launch (0.42 s), which this
    covers since."""
    launch_all(device, warm_up_launches(device, longest))


def warm_up_launches(device: torch.device, longest: dict[int, int]) -> list[Callable[[], object]]:
    """warm_up's launches, each on its own scores (for compile_threads.launch_all)."""
    return [functools.partial(_warm_up_launch, device, *launch) for launch in warm_up_rows(longest)]


def _warm_up_launch(device: torch.device, rows: int, N: int, k: int, chunks: int | None,
                    filtered: bool | None) -> None:
    top_k_ascending_kernel(torch.randn(rows, N, device=device), k, chunks=chunks, filtered=filtered)


def floor_rank(k: int, N: int, sample: int = SAMPLE) -> int:
    """Which best key of the sample is the floor: FLOOR_MARGIN times the number of the row's k
    best the sample holds on average, plus FLOOR_SLACK (k = 512 of 1M: 2 on average, rank 24).
    That is far beyond the spread of that number, so a floor above the k-th best score is rare;
    it costs one slow row, not a wrong one."""
    return min(sample, triton.cdiv(sample * k * FLOOR_MARGIN, N) + FLOOR_SLACK)
