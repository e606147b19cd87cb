"""Prefill's FP8 and FP4 matrix products on cuBLAS: the packed weight decoded to bf16 in one
launch (dequantize.py), then torch's bf16 GEMM with fp32 accumulation and output.

Our kernels decode the weight tile by tile in registers, which pays at decode, where a GEMM
reads its weight for a few rows; with a prefill chunk's thousands of rows the tensor cores
bound it, and cuBLAS's bf16 kernels keep them busier. H200, 2026-12-02 (fourteenth session,
bench/prefill_gemm_paths.py, 8,192 rows, faithful mode, decoding and rounding included):
wq_b 2.23 -> 1.03 ms, wo_b 2.17 -> 0.99, the shared expert's w1+w3 1.50 -> 0.57, its w2
0.82 -> 0.32, wq_a 0.56 -> 0.22, wkv 0.29 -> 0.14.

Same math as the kernels: every product is exact in fp32 (an e4m3 or e2m1 value times a
power-of-two scale is exact in bf16, and so is faithful mode's input on the FP8 grid); an fp32
input (exact mode) goes in as three bf16 parts that sum to it: for a dense weight side by side
along K against the weight repeated three times, so that cuBLAS adds the parts' products in its
own accumulator; for an expert stacked as rows, its three products summed after. Only the order
of the fp32 sums differs from the kernels. Faithful mode's products leave this path for the
FP8 tensor cores (FP8_TENSOR_CORES, fp8_blockwise.py), whose 128-column scale blocks round.
"""

from __future__ import annotations

import functools
import weakref

import torch

from . import fp8_blockwise
from .common import bf16_parts, interpreting
from .dequantize import fp4_quads_bf16, fp8_weight_bf16
from .pair_sums import pair_sums
from .quantize import fp8_grid_bf16
from .stream_turns import in_turns
from .swiglu import clamped_swiglu

# From this many rows (a prefill chunk) the FP8 and FP4 products run here; decode's few rows,
# up to a batch of 32 six-row blocks, keep the kernels, which read each weight byte once.
ROWS = 1024
# The routed experts run here from this many pairs an expert on average: below it (H200,
# 1,024 tokens: 128 pairs an expert) the decodes and per-expert launches cost more than
# fp4_moe's one launch. EXACT_EXPERTS: exact mode's fp32 input too (three bf16 parts).
EXPERT_PAIRS = 512
EXACT_EXPERTS = True
# Faithful mode's products (bf16 rows on the FP8 grid) on the FP8 tensor cores, their operands
# re-encoded to 128-column scale blocks (fp8_blockwise: what that rounds, and the timings);
# False: the weights decoded to bf16 and exact products, as exact mode's.
FP8_TENSOR_CORES = True


class EncodedWeights:
    """Weights re-encoded for the FP8 tensor cores (fp8_blockwise: e4m3 under 128 x 128 scale
    blocks), kept from chunk to chunk up to `budget` bytes, first come first kept; past it they
    are encoded each time, as without. Each faithful prefill chunk otherwise encodes every
    weight again: the routed experts (fp4_weight_128, twice their FP4 bytes) 21 ms of a 16K
    chunk at the bench preset (40 launches, at their bytes; ~1.3 s of a 1M prompt), the dense
    FP8 weights (fp8_weight_128, their own bytes, 6.5 GB for the bench preset's 40 layers) ~3-6
    ms (~0.2-0.4 s of a 1M prompt), which a prefill worker, whose KV pool holds only the
    prompts in flight, may rather spend memory on (`dsflash prefill --weight-cache-bytes`: 1.7
    GB a layer of the bench preset's 48 experts, ~0.16 GB a layer of dense weights)."""

    def __init__(self, budget: int):
        self.budget, self.used = budget, 0
        self._kept: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        # a dense weight's encoding under its codes' id (and whether its row blocks are reordered),
        # with a reference to the codes whose end drops the entry (a weight replaced, as
        # linear_many's merge replaces its parts)
        self._dense: dict[tuple[int, bool], tuple[weakref.ref, tuple[torch.Tensor, torch.Tensor]]] = {}

    @staticmethod
    def _size(encoded: tuple[torch.Tensor, torch.Tensor]) -> int:
        return sum(t.numel() * t.element_size() for t in encoded)

    def _keep(self, encoded: tuple[torch.Tensor, torch.Tensor]) -> bool:
        size = self._size(encoded)
        if self.used + size > self.budget:
            return False
        self.used += size
        return True

    def dense(self, codes: torch.Tensor, scales: torch.Tensor, blocks: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """_weight_128's encoding of (codes, scales) with its row blocks in `blocks`' order, kept
        for these codes (the same tensor object each chunk, as the ops hold their weights)."""
        key = id(codes), blocks is not None
        kept = self._dense.get(key)
        if kept is not None:
            return kept[1]
        encoded = _block_rows(fp8_blockwise.fp8_weight_128(codes, scales), blocks)
        if self._keep(encoded):
            self._dense[key] = weakref.ref(codes, functools.partial(self._forget, key)), encoded
        return encoded

    def _forget(self, key: tuple[int, bool], ref: weakref.ref) -> None:
        kept = self._dense.get(key)
        if kept is not None and kept[0] is ref:
            del self._dense[key]
            self.used -= self._size(kept[1])

    def experts(self, key: tuple):
        """encode(experts, units, scales) for one stacked matrix of routed experts (`key`: which;
        its slices of experts are kept apart)."""
        def encode(experts: slice, units: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            at = key + (experts.start, experts.stop)
            kept = self._kept.get(at)
            if kept is not None:
                return kept
            encoded = _encode(experts, units, scales)
            if self._keep(encoded):
                self._kept[at] = encoded
            return encoded
        return encode


def _weight_128(codes: torch.Tensor, scales: torch.Tensor, kept: EncodedWeights | None,
                blocks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense FP8 weight under 128 x 128 blocks, its 128-row blocks in `blocks`' order where
    given (each block's encoding is its own, so the order changes no bits): from `kept` where
    given, else encoded now."""
    if kept is not None:
        return kept.dense(codes, scales, blocks)
    return _block_rows(fp8_blockwise.fp8_weight_128(codes, scales), blocks)


def _block_rows(encoded: tuple[torch.Tensor, torch.Tensor], blocks: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A 128 x 128 encoding with its row blocks reordered (as they are where blocks is None). The
    scales keep their rows' padding to 4 scales (fp8_blockwise._weight_scales), where cuBLAS reads
    them whatever strides torch is handed."""
    if blocks is None:
        return encoded
    codes, scales = encoded
    N, K = codes.shape
    ordered = fp8_blockwise.weight_scales_like(N, K, codes.device)
    ordered.copy_(scales[blocks])
    return codes.view(N // 128, 128, K)[blocks].view(N, K), ordered


def _encode(experts: slice, units: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of experts' FP4 weights re-encoded for the FP8 tensor cores, each time."""
    return fp8_blockwise.fp4_weight_128(units[experts], scales[experts])


def takes(x: torch.Tensor) -> bool:
    """Whether a dense product with input x runs here (takes_rows)."""
    return takes_rows(x.shape[0], x.device)


def takes_rows(rows: int, device: torch.device) -> bool:
    """Whether a dense product of `rows` input rows on `device` runs here: prefill rows on the
    GPU (the CPU tests call the functions below directly). Never inside a CUDA graph capture (a
    decode batch past ROWS rows): a graph would keep every decoded weight in its memory pool,
    and fp4_experts reads its row counts on the host."""
    return (rows >= ROWS and device.type == "cuda" and not interpreting()
            and not torch.cuda.is_current_stream_capturing())


def takes_experts(x: torch.Tensor, pairs: int, experts: int) -> bool:
    """Whether the routed experts of these pairs run here (fp4_experts) rather than on fp4_moe."""
    return (EXACT_EXPERTS or x.dtype == torch.bfloat16) and _chunk_pairs(x, pairs, experts)


def _chunk_pairs(x: torch.Tensor, pairs: int, experts: int) -> bool:
    """Whether rows x and their pairs are a prefill chunk's, as this path takes them."""
    return takes(x) and pairs >= EXPERT_PAIRS * experts


def expert_rows_operand(x: torch.Tensor, pairs: int, experts: int, w13: torch.Tensor
                        ) -> fp8_blockwise.Operand | None:
    """Faithful mode's fp32 rows x of a prefill chunk's routed pairs, encoded once for the FP8
    tensor cores with the rounding inside (EXPERT_ROWS_ENCODED_ONCE), for fp4_experts; None
    where they go as the bf16 rows of the rounding launch."""
    if not takes_expert_rows_operand(x, pairs, experts, w13):
        return None
    return fp8_blockwise.Operand(*fp8_blockwise.rows_1x128(x.contiguous(), round_first=True), x.shape[0])


def takes_expert_rows_operand(x: torch.Tensor, pairs: int, experts: int, w13: torch.Tensor) -> bool:
    """Whether the routed pairs of rows x take them encoded once (expert_rows_operand's, or the
    same operand made elsewhere: TritonOps.ffn_operand)."""
    return (EXPERT_ROWS_ENCODED_ONCE and FP8_TENSOR_CORES and x.dtype == torch.float32
            and _chunk_pairs(x, pairs, experts) and fp8_blockwise.runs_on(x.device, w13.shape[1], x.shape[1]))


def _product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b (2-D or batched 3-D) for bf16 a and b, accumulated in and returned as fp32: cuBLAS
    on the GPU; elsewhere (the CPU tests) the fp32 product of the same values."""
    if a.is_cuda:
        op = torch.mm if a.dim() == 2 else torch.bmm
        return op(a, b, out_dtype=torch.float32, out=out)
    return torch.matmul(a.float(), b.float(), out=out)


def _parts(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x [..., K] as bf16 [..., copies * K] whose products are exact: a bf16 x as it is, an fp32
    one as its three bf16 parts side by side."""
    if x.dtype == torch.bfloat16:
        return x, 1
    parts = bf16_parts(x.contiguous(), 3)
    return parts.movedim(0, -2).reshape(*x.shape[:-1], 3 * x.shape[-1]), 3


def _repeated(w: torch.Tensor, copies: int) -> torch.Tensor:
    """A weight [..., N, K] side by side `copies` times along K, against _parts' columns."""
    return w.repeat(*[1] * (w.dim() - 1), copies) if copies > 1 else w


def bf16_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight^T for a bf16 weight [N, K] -> [M, N] fp32, as fp8_gemm.bf16_gemm."""
    a, copies = _parts(x)
    return _product(a, _repeated(weight, copies).T)


def _tensor_cores(x: torch.Tensor | fp8_blockwise.Operand, n: int, k: int) -> bool:
    """Whether x's product with an [n, k] weight runs on the FP8 tensor cores (x: faithful mode's
    bf16 rows, or an operand encoded for them)."""
    if isinstance(x, fp8_blockwise.Operand):
        return fp8_blockwise.runs_on(x.codes.device, n, k)
    return FP8_TENSOR_CORES and fp8_blockwise.fits(x, n, k)


def rounds_in_encode(x: torch.Tensor, n: int, k: int) -> bool:
    """Whether faithful mode's 1 x 32 rounding of x (fp32 prefill rows) happens in the FP8
    operand's encode for an [n, k] weight's product (ROUND_IN_ENCODE) rather than in a launch
    before it."""
    return x.dtype == torch.float32 and takes(x) and _rounds_in_encode_on(x.device, n, k)


def takes_operand(rows: int, device: torch.device, n: int, k: int) -> bool:
    """Whether a product of `rows` fp32 input rows on `device` and an [n, k] weight rounds them
    in its encode (rounds_in_encode), and so may take instead the operand made by the launch
    that computed the rows (fp8_blockwise.Operand)."""
    return takes_rows(rows, device) and _rounds_in_encode_on(device, n, k)


def _rounds_in_encode_on(device: torch.device, n: int, k: int) -> bool:
    return ROUND_IN_ENCODE and FP8_TENSOR_CORES and fp8_blockwise.runs_on(device, n, k)


def fp8_product(x: torch.Tensor | fp8_blockwise.Operand, codes: torch.Tensor, scales: torch.Tensor,
                round_first: bool = False, kept: EncodedWeights | None = None) -> torch.Tensor:
    """x [M, K] @ (codes, scales)^T -> [M, N] fp32, as fp8_gemm computes it. round_first (on
    the FP8 tensor cores, rounds_in_encode): x rounded onto faithful mode's FP8 grid first.
    x may come encoded already (an Operand of one group: an mHC site's, TritonOps.ffn_operand's).
    kept: where the weight's FP8 tensor-core form may be kept (EncodedWeights)."""
    if isinstance(x, fp8_blockwise.Operand):
        assert x.codes.shape[0] == 1 and x.shape[1] == codes.shape[1], (x.codes.shape, codes.shape)
        return _encoded_product(x.codes, x.scales, x.m, codes, scales, kept)
    if round_first or _tensor_cores(x, *codes.shape):
        return _encoded_product(*fp8_blockwise.rows_1x128(x, round_first=round_first), x.shape[0], codes, scales,
                                kept)
    return bf16_product(x, fp8_weight_bf16(codes, scales))


def takes_query_halves(x: torch.Tensor, codes: torch.Tensor, heads: int, plain: int) -> bool:
    """Whether query_halves_product runs for faithful prefill rows x (rounds_in_encode) and wq_b's
    FP8 codes [heads * D, K], `plain` channels of each head's D first: whole 128-row blocks."""
    n, k = codes.shape
    return (rounds_in_encode(x, n, k) and n % heads == 0 and (n // heads) % 128 == 0 and plain % 128 == 0
            and 0 < plain < n // heads)


def query_halves_product(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, heads: int, plain: int,
                         kept: EncodedWeights | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8_gemm(x, codes, scales, act_quant=True) for faithful prefill rows x [M, K]
    (takes_query_halves) as the attention's queries in halves (attention_queries.QueryHalves):
    each head's first `plain` channels rounded to bf16 [M, heads, plain], the rest in fp32 [M,
    heads, D - plain]. Two products over the weight with its row blocks reordered (every head's
    first blocks, then every head's others), each writing its output in its own type."""
    m, dim, split = x.shape[0], codes.shape[0] // heads, heads * plain
    a, a_scales = fp8_blockwise.rows_1x128(x, round_first=True)
    w, w_scales = _weight_128(codes, scales, kept, _plain_blocks_first(heads, dim // 128, plain // 128, codes.device))
    first = _product_128(a, a_scales, m, w[:split], w_scales[:split // 128], dtype=torch.bfloat16)
    rest = _product_128(a, a_scales, m, w[split:], w_scales[split // 128:])
    return first.view(m, heads, plain), rest.view(m, heads, dim - plain)


@functools.cache
def _plain_blocks_first(heads: int, blocks: int, plain: int, device: torch.device) -> torch.Tensor:
    """The 128-row blocks of a [heads * blocks * 128, K] weight: each head's first `plain`, head
    after head, then each head's others."""
    order = torch.arange(heads * blocks).view(heads, blocks)
    return torch.cat([order[:, :plain].flatten(), order[:, plain:].flatten()]).to(device)


def swiglu_fits(gate: torch.Tensor, up: torch.Tensor, n: int) -> bool:
    """Whether swiglu_fp8_product runs for faithful mode's SwiGLU of gate and up (prefill rows,
    one layout) into an [n, I] FP8 weight (the shared expert's down projection)."""
    return (SWIGLU_ENCODE and FP8_TENSOR_CORES and takes(gate) and gate.stride() == up.stride()
            and gate.shape == up.shape and gate.stride(1) == 1 and fp8_blockwise.runs_on(gate.device, n, gate.shape[1]))


def swiglu_fp8_product(gate: torch.Tensor, up: torch.Tensor, limit: float, codes: torch.Tensor,
                       scales: torch.Tensor, kept: EncodedWeights | None = None) -> torch.Tensor:
    """fp8_product(fp8_grid_bf16(clamped_swiglu(gate, up, limit)), codes, scales) on the FP8
    tensor cores, the SwiGLU, its rounding and the operand's encode in one launch
    (fp8_blockwise.swiglu_rows_1x128: at a 16K chunk's shared expert, the SwiGLU's fp32 output,
    its bf16 rounding and their reads, ~0.5 GB a layer, are never written)."""
    return _encoded_product(*fp8_blockwise.swiglu_rows_1x128(gate, up, limit), gate.shape[0], codes, scales, kept)


def _encoded_product(a: torch.Tensor, a_scales: torch.Tensor, m: int, codes: torch.Tensor,
                     scales: torch.Tensor, kept: EncodedWeights | None) -> torch.Tensor:
    """The first m rows of rows_1x128's operand (a, a_scales) times an FP8 weight re-encoded to 128 x 128 blocks."""
    return _product_128(a, a_scales, m, *_weight_128(codes, scales, kept))


def _product_128(a: torch.Tensor, a_scales: torch.Tensor, m: int, w: torch.Tensor, w_scales: torch.Tensor,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The first m rows of rows_1x128's operand (a, a_scales) times a weight under 128 x 128
    blocks (w, w_scales), written in `dtype` (fp8_blockwise.product)."""
    rows = a.shape[1]  # the m rows and the aligned rows after them
    a_scales = fp8_blockwise.segment_scales(a_scales, w.shape[1] // 128, 0, rows)
    return fp8_blockwise.product(a[0], a_scales, w, w_scales, dtype=dtype)[:m]


def grouped_fp8_product(x: torch.Tensor | fp8_blockwise.Operand, codes: torch.Tensor, scales: torch.Tensor,
                        groups: int, round_first: bool = False, kept: EncodedWeights | None = None) -> torch.Tensor:
    """Block-diagonal y [M, G*R] = x [M, G*K], group g's rows of (codes, scales) [G*R, K] applied
    to x's columns g*K .. (the attention output's wo_a), as grouped_fp8_gemm computes it;
    round_first as fp8_product's. x may come encoded already (an Operand of those groups)."""
    M = x.shape[0]
    N, K = codes.shape
    if isinstance(x, fp8_blockwise.Operand) or round_first or _tensor_cores(x, N // groups, K):
        return _grouped_on_tensor_cores(x, codes, scales, groups, round_first, kept)
    a, copies = _parts(x.view(M, groups, K).transpose(0, 1))  # [G, M, copies * K]
    w = fp8_weight_bf16(codes, scales).view(groups, N // groups, K)
    # each group's product written to its columns of y (cuBLAS takes the row stride): a [G, M, R]
    # result copied over as [M, G * R] cost 205 us a layer at a chunk (H200, sixteenth session)
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    _product(a, _repeated(w, copies).transpose(1, 2), out=y.view(M, groups, N // groups).transpose(0, 1))
    return y


def _grouped_on_tensor_cores(x: torch.Tensor | fp8_blockwise.Operand, codes: torch.Tensor, scales: torch.Tensor,
                             groups: int, round_first: bool, kept: EncodedWeights | None) -> torch.Tensor:
    """grouped_fp8_product on the FP8 tensor cores: x's codes laid out a group at a time, one
    product a group into its columns of y."""
    N, K = codes.shape
    rows, blocks = N // groups, K // 128
    if isinstance(x, fp8_blockwise.Operand):
        assert x.codes.shape[0] == groups and x.codes.shape[2] == K, (x.codes.shape, groups, K)
        a, a_scales = x.codes, x.scales
    else:
        a, a_scales = fp8_blockwise.rows_1x128(x, groups, round_first=round_first)
    w, w_scales = _weight_128(codes, scales, kept)
    M = a.shape[1]  # x's rows and the aligned rows after them
    y = torch.empty(M, N, dtype=torch.float32, device=a.device)
    with in_turns(a.device, PRODUCT_STREAMS) as turns:
        for g, turn in zip(range(groups), turns):
            with turn:
                fp8_blockwise.product(a[g], fp8_blockwise.segment_scales(a_scales, blocks, 0, M, g * blocks,
                                                                         groups * blocks),
                                      w[g * rows:(g + 1) * rows], w_scales[g * rows // 128:(g + 1) * rows // 128],
                                      out=y[:, g * rows:(g + 1) * rows])
    return y[:x.shape[0]]


def fp4_experts(x: torch.Tensor | fp8_blockwise.Operand, idx: torch.Tensor, weights: torch.Tensor,
                w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor, limit: float,
                act_quant: bool = False, encoded: tuple | None = None, plus: torch.Tensor | None = None
                ) -> torch.Tensor:
    """fp4_moe's result ([T, H] fp32) for the same arguments (ids past the last expert: other
    ranks' pairs, left 0). The pairs are sorted by expert once; the experts' weights are decoded
    to bf16 in one launch a matrix (up to DECODE_EXPERTS at a time: one launch an expert cost
    11.5 against 9.3 ms at 8,192 tokens), then each expert's run of rows is one product. Each
    token's k outputs are summed in pair order, as fp4_moe sums them (no atomics). `encoded`:
    the gate/up and down matrices' encoders (EncodedWeights.experts) where their FP8 forms are
    kept. plus [T, H] fp32: added to each token's sum (pair_sums), after its pairs. x may come
    as faithful mode's operand of the tokens' rows (EXPERT_ROWS_ENCODED_ONCE): each pair's row is
    then gathered from its codes (fp8_blockwise.gathered_1x128), not encoded again."""
    encode13, encode2 = encoded or (_encode, _encode)
    T, H = x.shape
    device = idx.device
    k = idx.shape[1]
    E, two_i, _ = w13.shape
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)[:E].tolist()  # one sync: the products' row counts
    live = order[:sum(counts)]
    if not live.numel():  # every pair is another rank's
        zeros = torch.zeros(T, H, dtype=torch.float32, device=device)
        return zeros if plus is None else zeros.add_(plus)
    # the FP8 tensor cores take each expert's run of rows padded to fp8_blockwise.ROW_ALIGN: the
    # padding rows repeat token 0 with routing weight 0, and no pair reads their results
    align = fp8_blockwise.ROW_ALIGN if _tensor_cores(x, two_i, H) else 1
    runs = [-(-count // align) * align for count in counts]
    at = _run_rows(flat[live], counts, runs)  # sorted pair -> its row
    tokens = torch.zeros(sum(runs), dtype=torch.int64, device=device).index_copy_(0, at, live // k)
    row_weights = torch.zeros(sum(runs), dtype=weights.dtype, device=device).index_copy_(
        0, at, weights.reshape(-1)[live])
    gate_up = _by_expert(x, runs, w13, s13, tokens, encode13)
    down = _down_projection(x, gate_up, runs, row_weights, w2, s2, limit, act_quant, encode2)
    place = torch.full((flat.shape[0],), -1, dtype=torch.int64, device=device)
    place[live] = at  # pair -> its row of `down` (-1: none)
    return pair_sums(down, place.view(T, k), plus)


def _down_projection(x: torch.Tensor | fp8_blockwise.Operand, gate_up: torch.Tensor, runs: list[int],
                     row_weights: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor, limit: float, act_quant: bool,
                     encode=_encode) -> torch.Tensor:
    """Each pair's clamped SwiGLU of its gate/up row times its routing weight (in faithful mode
    on the FP8 grid, fake_quant_fp8) through its expert's down projection -> [rows, H] fp32."""
    inter = gate_up.shape[1] // 2
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    on_grid = act_quant and inter % 32 == 0
    if on_grid and SWIGLU_ENCODE and _tensor_cores(x, x.shape[1], inter):  # all of it in the operand's encode
        a, a_scales = fp8_blockwise.swiglu_rows_1x128(gate, up, limit, row_weights, counts=runs)
        out = torch.empty(sum(runs), x.shape[1], dtype=torch.float32, device=gate_up.device)
        return _expert_products(a, a_scales, runs, w2, s2, out, encode)
    if SWIGLU_EPILOGUE:  # the routing weights and the rounding in the SwiGLU's launch
        h = clamped_swiglu(gate, up, limit, row_weights=row_weights, fp8_grid=on_grid)
    else:  # the passes it replaced, for comparisons
        h = clamped_swiglu(gate, up, limit) * row_weights[:, None]
        h = fp8_grid_bf16(h) if on_grid else h
    return _by_expert(h, runs, w2, s2, encode=encode)


def _run_rows(experts: torch.Tensor, counts: list[int], runs: list[int]) -> torch.Tensor:
    """Pairs sorted by expert (their experts' ids) -> each one's row where expert e's pairs take
    the first counts[e] of its runs[e] rows."""
    if runs == counts:
        return torch.arange(experts.shape[0], device=experts.device)
    firsts = torch.tensor([0] + counts[:-1], device=experts.device).cumsum(0)
    starts = torch.tensor([0] + runs[:-1], device=experts.device).cumsum(0)
    return torch.arange(experts.shape[0], device=experts.device) + (starts - firsts)[experts]


# The routing weights and faithful mode's FP8 rounding of the down projection's input in the
# SwiGLU's launch; False: torch's product and a round trip after it (bench/decode_ab.py).
SWIGLU_EPILOGUE = True
# Faithful mode on the FP8 tensor cores: the SwiGLU (with the routing weights and the rounding)
# computed inside the down projection's operand encode (fp8_blockwise.swiglu_rows_1x128), for
# the routed experts and the shared expert (swiglu_fp8_product). At a 16K chunk that leaves
# out a write and a read of the SwiGLU's output (~0.9 GB a layer for the routed experts) and,
# for the shared expert, a round trip's launch. H200, forty-second session: a 32K faithful
# prefill 1.266 s against 1.274, its last logits the same to the bit.
SWIGLU_ENCODE = True

# Faithful mode on the FP8 tensor cores: a dense product's fp32 input rounded onto the 1 x 32
# FP8 grid inside its operand's encode (fp8_blockwise.rows_1x128's round_first), not by a
# launch before it: at a 16K chunk that launch's bf16 output, written and read again, is a
# third of the bytes around each of a layer's six FP8 products (28 ms of 1 x 32 round trips
# in the thirty-seventh session's chunk profile). H200, forty-second session: a layer's eight
# operands at 16,384 rows 732 us rounded inside against 1,298 rounded before
# (bench/fp8_scaled_mm.py); a 32K faithful prefill 1.259 s against 1.306 (with the encode's
# 32-row tiles), its last logits the same to the bit.
ROUND_IN_ENCODE = True

# Faithful prefill's routed experts take their tokens' rows as one operand, encoded once from
# the fp32 rows with the rounding inside (rows_1x128's round_first), each pair's row then copied
# from its codes (fp8_blockwise.gathered_1x128): the same operand bits as the rounding launch
# (TritonOps.gemm_input's bf16 rows) and an encode of each pair's row. At a 16K chunk (6 pairs a
# token, 5,120 columns) ~1.4 GB of a layer's traffic where that was ~2.0 (~0.2 ms on an H100 by
# the bytes). H100 32K faithful prefill, alternated (fifty-first session, call T): 1.233 / 1.210 ->
# 1.204 / 1.200 s, the same last logits.
EXPERT_ROWS_ENCODED_ONCE = True
# With it, the shared expert's gate/up product takes the same operand (TritonOps.ffn_operand:
# both encode the FFN rows alike), one encode of the [T, H] fp32 rows a layer fewer (~0.1 ms at a
# 16K chunk by the bytes), the same bits by construction (CPU test). H100 32K faithful prefill,
# alternated (fifty-second session, call Y): 1.177 / 1.181 -> 1.172 / 1.170 s, the same last logits.
SHARED_EXPERT_OPERAND = True

# A layer's independent products (the routed experts' runs of rows, on the FP8 tensor cores in
# faithful mode and in bf16 parts in exact mode; wo_a's groups) launched on this many CUDA
# streams in turn (stream_turns.in_turns), so that one product's last, partly filled wave of
# tiles runs beside the next one's first; the same bits (each product is the same launch on any
# stream). H100, 2026-12-07 (sixty-sixth session, bench/decode_ab.py, a 256K faithful prefill in
# 16K chunks, one process, the rounds after the first's compiles): 1 stream 9.597 / 9.572 s,
# 2 streams 9.494 / 9.391 (round 0's 9.481 too), ~1.5% less, with the same last logits. Another
# H100 (sixty-seventh, call BT, same form): 2 streams 9.482 / 9.436, 3 streams 9.450 / 9.534,
# 1 stream 9.601 / 9.608; 1M in 16K chunks (call BR, 1 | 2 | 1 | 2 in one process, the first run
# with the kit's cache loads): 47.84, 46.63, 46.50, 45.37 s, the same last logits in all, peak
# 59.7 / 60.7 GiB. 3 buys nothing over 2. 1: one after another on the current one.
PRODUCT_STREAMS = 2

# Experts decoded to bf16 at once, one matrix kind at a time: at the release widths 47.2 MB an
# expert for gate/up, 23.6 for down (3.0 GB at most for gate/up).
DECODE_EXPERTS = 64


def _by_expert(rows: torch.Tensor | fp8_blockwise.Operand, counts: list[int], units: torch.Tensor,
               scales: torch.Tensor, sources: torch.Tensor | None = None, encode=_encode) -> torch.Tensor:
    """Each expert's run of rows (in expert order, counts[e] each; with sources, rows' rows
    sources[i]; rows may be an operand of them) times its weight (quad units [E, N, K/4] and
    scales, decoded here) -> [rows, N] fp32. fp32 rows go in as three bf16 parts stacked as
    rows, their products summed after: side by side along K (as the dense products take them)
    each expert's weight would be copied three times over, 6.8 GB a layer."""
    N = units.shape[1]
    out = torch.empty(sum(counts), N, dtype=torch.float32, device=units.device)
    if isinstance(rows, fp8_blockwise.Operand):  # the tokens' rows encoded once: each pair's copied
        return _expert_products(*fp8_blockwise.gathered_1x128(rows, counts, sources), counts, units, scales, out,
                                encode)
    if _tensor_cores(rows, N, 4 * units.shape[2]):  # faithful rows: their codes made once, read where they lie
        return _expert_products(*fp8_blockwise.rows_1x128(rows, counts=counts, sources=sources), counts, units,
                                scales, out, encode)
    if sources is not None:
        rows = rows.index_select(0, sources)
    for experts, runs in _expert_batches(counts):
        decoded = fp4_quads_bf16(units[experts], scales[experts])
        with in_turns(units.device, PRODUCT_STREAMS) as turns:  # (decoded lives until the streams have joined)
            for (e, start, count), turn in zip(runs, turns):
                with turn:
                    run, run_out = rows[start:start + count], out[start:start + count]
                    if run.dtype == torch.bfloat16:
                        _product(run, decoded[e].T, out=run_out)
                    else:
                        parts = bf16_parts(run, 3)
                        torch.sum(_product(parts.view(3 * count, -1), decoded[e].T).view(3, count, N), dim=0,
                                  out=run_out)
    return out


def _expert_batches(counts: list[int]):
    """Experts DECODE_EXPERTS at a time (their weights converted together), those with rows:
    (the batch's slice of experts, (expert within it, its first row, its rows) for each run)."""
    start = 0
    for first in range(0, len(counts), DECODE_EXPERTS):
        runs = []
        for e, count in enumerate(counts[first:first + DECODE_EXPERTS]):
            if count:
                runs.append((e, start, count))
                start += count
        if runs:
            yield slice(first, first + DECODE_EXPERTS), runs


def _expert_products(a: torch.Tensor, a_scales: torch.Tensor, counts: list[int], units: torch.Tensor,
                     scales: torch.Tensor, out: torch.Tensor, encode=_encode) -> torch.Tensor:
    """Each expert's run of rows_1x128's rows (counts[e] each, their scales together) times its
    weight re-encoded as e4m3 (DECODE_EXPERTS at a time, half the bytes of their bf16 decode;
    by `encode`, which may keep them) into out's rows, on the FP8 tensor cores."""
    blocks = a.shape[2] // 128
    for experts, runs in _expert_batches(counts):
        w, w_scales = encode(experts, units, scales)
        with in_turns(a.device, PRODUCT_STREAMS) as turns:  # (w lives until the streams have joined)
            for (e, start, count), turn in zip(runs, turns):
                with turn:
                    run_scales = fp8_blockwise.segment_scales(a_scales, blocks, start, count)
                    fp8_blockwise.product(a[0, start:start + count], run_scales, w[e], w_scales[e],
                                          out=out[start:start + count])
    return out
