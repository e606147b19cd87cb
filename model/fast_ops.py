"""The fast path: weights stay packed on the device, heavy ops run as Triton kernels.

Same interface as ReferenceOps (layers ask `ops.fast` to pick kernel paths), same math:
every kernel is checked against the reference it replaces (tests/model/test_kernels.py).
- FP8 GEMMs decode their 32x32-block weights in registers (fp8_gemm); at decode sizes the
  bf16- and fp32-weight GEMMs (router, compressor, indexer, LM heads, mHC mixes) and the
  block-diagonal wo_a run on the same transposed decode kernel;
- routed experts run as two grouped GEMMs over packed FP4 weights (fp4_moe);
- attention and indexer scoring read the paged cache's bytes in place (their layers call them);
- the FP8/FP4 cache round trips run as one launch each (quantize), not ~25 small torch ops;
- the mHC stream updates (expand, collapse + norm) read the streams once each (hc_streams);
- the compressor's pooling + norm, and its entries' and keys' norm + RoPE + FP4, are one
  launch each (compressor);
- RMSNorm, the shared expert's clamped SwiGLU and the router after its GEMM (scores, top-k,
  weights) are one launch each where torch takes four to twelve kernels (rms_norm, swiglu,
  top_experts): inside a decode step's CUDA graphs each kernel costs ~2 microseconds.
"""

from __future__ import annotations

from typing import Callable

import torch

from .kernels import compressor, engram_gate, hc_streams, prefill_gemms, swiglu, tall_bf16
from .kernels import rms_norm as norm_kernel
from .kernels.attention_queries import QueryHalves
from .kernels.common import interpreting, quad_units
from .kernels.fp8_blockwise import Operand, empty_operand
from .kernels.fp4_moe import fp4_moe, small_scales
from .kernels.fp8_gemm import (LANES, bf16_decode_rows, bf16_gemm, counts_lane, fp32_gemm, fp8_gemm, grouped_fp8_gemm,
                                small_fp8_scales, tile_counts)
from .kernels.hc_gates import hc_gates, hc_gates_from_parts
from .kernels.quantize import fp4_round_trip, fp8_grid_bf16, fp8_round_trip
from .kernels.rope import rope
from .kernels.top_experts import supported as top_experts_fits
from .kernels.top_experts import top_experts
from .layers.mhc import hc_mixes
from .ops import ReferenceOps, T
from .parallel import SINGLE, Parallel
from .quant import Packed
from .weights import Fp4Weight, Fp8Weight, WeightStore


# Output widths from which bf16 GEMMs of any row count take the kernel (the LM heads).
WIDE_OUTPUT = 32768
# Rows up to which the shared expert runs on a side stream beside the routed experts
# (ops.beside): its GEMMs can take the SMs the routed kernels' ramps and tails leave idle, and
# the sums are the same either way. 0: on the main stream, after them, as before.
SIDE_STREAM_ROWS = 256
# One launch each for RMSNorm, the shared expert's SwiGLU and the router after its GEMM, where
# torch takes four to twelve kernels (False: the torch forms, for comparisons: decode_ab.py).
FUSED_SMALL_OPS = True


class TritonOps(ReferenceOps):
    fast = True

    def __init__(self, weights: WeightStore, act_quant: bool = False, device: str | torch.device = "cuda",
                 parallel: Parallel = SINGLE):
        super().__init__(weights, act_quant=act_quant, device=device, parallel=parallel)
        self._packed: dict[str, tuple[Fp8Weight, bool]] = {}
        self._bf16: dict[str, torch.Tensor] = {}
        self._experts: dict[str, tuple[tuple[torch.Tensor, ...], bool]] = {}
        self._merged: dict[tuple[str, ...], tuple | bool] = {}  # linear_many's weights end to end
        self._site_input: tuple[torch.Tensor, Operand] | None = None  # (encoded_input)
        self._fn_parts_of: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # (_fn_parts)
        # faithful prefill's weights kept re-encoded for the FP8 tensor cores (keep_encoded_weights)
        self.weight_cache: prefill_gemms.EncodedWeights | None = None
        self._side = None
        if self.device.type == "cuda":
            for lane in range(LANES):
                tile_counts(self.device, lane)  # now, before any CUDA graph is captured
            self._side = torch.cuda.Stream(self.device)

    def _fp8(self, name: str) -> tuple[Fp8Weight, bool]:
        """An FP8 weight on the device, and whether its scales allow the one-multiply decoder."""
        packed = self._packed.get(name)
        if packed is None:
            on_device = self.weights[name].to(self.device)
            packed = self._packed[name] = on_device, small_fp8_scales(on_device.scale)
        return packed

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        weight = self.weights[name]
        if isinstance(weight, Fp8Weight):
            packed, small = self._fp8(name)
            return fp8_gemm(x.contiguous(), packed.weight, packed.scale, act_quant=self.act_quant, small=small,
                            kept=self.weight_cache)
        rows = x.reshape(-1, x.shape[-1])
        bf16 = isinstance(weight, torch.Tensor) and weight.dtype == torch.bfloat16 and _kernels_run_on(x)
        if bf16 and tall_bf16.takes(rows.shape[0], x, weight):
            # a prefill chunk's fp32 rows against the routers' and compressors' weights: one read
            # of the rows on the TF32 tensor cores (tall_bf16)
            return tall_bf16.product(rows.contiguous(), self._bf16_weight(name)).view(*x.shape[:-1], weight.shape[0])
        prefill = bf16 and _wide_prefill(rows, weight)
        if bf16 and (bf16_decode_rows(rows.shape[0], weight) or weight.shape[0] >= WIDE_OUTPUT or prefill):
            # bf16 tensor cores at fp32 accuracy on the weight as stored (half the bytes of an
            # fp32 copy): decode rows (one launch, the parts cut in the kernel; up to 256 rows
            # of the small weights, fp8_gemm.BF16_SKINNY_ROWS), the LM heads
            # (2.6x faster than the fp32 matmul at 48 rows), and a prefill chunk's rows that
            # tall_bf16 does not take, from 256 outputs (cuBLAS on three bf16 parts: the fp32
            # product ran at the CUDA cores' rate). Other shapes keep torch's fp32 product.
            dense = self._bf16_weight(name)
            gemm = prefill_gemms.bf16_product if prefill else bf16_gemm
            return gemm(rows.contiguous(), dense).view(*x.shape[:-1], dense.shape[0])
        return super().linear(x, name)

    def _bf16_weight(self, name: str) -> torch.Tensor:
        """A bf16 weight on the device, contiguous (kept)."""
        dense = self._bf16.get(name)
        if dense is None:
            dense = self._bf16[name] = self.weights[name].to(self.device).contiguous()
        return dense

    def attention_queries(self, x: torch.Tensor, name: str, heads: int, dim: int, plain: int = 0
                          ) -> torch.Tensor | QueryHalves:
        """Faithful prefill rows' queries in halves where `plain` channels a head allow it
        (prefill_gemms.query_halves_product); else as the reference ops make them."""
        weight = self.weights[name]
        if plain and self.act_quant and isinstance(weight, Fp8Weight) and _kernels_run_on(x):
            packed, _ = self._fp8(name)
            if prefill_gemms.takes_query_halves(x, packed.weight, heads, plain):
                return QueryHalves(*prefill_gemms.query_halves_product(x, packed.weight, packed.scale, heads, plain,
                                                                       kept=self.weight_cache))
        return super().attention_queries(x, name, heads, dim, plain)

    def linear_many(self, x: torch.Tensor, names: tuple[str, ...]) -> list[torch.Tensor]:
        """One GEMM for FP8 weights of one input width in whole 32-row blocks: at decode each
        launch costs a fixed ~10 us beside its weight's bytes. Their codes and scales are put
        end to end once, and each weight becomes a view of its rows there (no second copy);
        the output is split back. Other weights run one by one."""
        merged = self._merged_of(names)
        if isinstance(x, Operand):  # (an mHC site's or ffn_operand's: made only where the weights merge)
            assert merged, names
            codes, scales, _, rows = merged
            out = prefill_gemms.fp8_product(x, codes, scales, kept=self.weight_cache)
            return list(out.split(rows, dim=-1))
        if not merged:
            return super().linear_many(x, names)
        codes, scales, small, rows = merged
        out = fp8_gemm(x.contiguous(), codes, scales, act_quant=self.act_quant, small=small, kept=self.weight_cache)
        return list(out.split(rows, dim=-1))

    def _merged_of(self, names: tuple[str, ...]) -> tuple | bool:
        merged = self._merged.get(names)
        if merged is None:
            merged = self._merged[names] = self._merge(names)
        return merged

    def ffn_operand(self, x: torch.Tensor, experts: str, local: range, k: int, shared: tuple[str, ...]
                    ) -> Operand | None:
        """Faithful prefill on one rank: the FFN's rows x encoded once (rows_1x128, the rounding
        inside) for the shared expert's merged gate/up product (`shared`) and, where they take
        it, the routed experts' pairs (k a token; routed_experts): from the FFN site's pass (its
        encode_for: hc_streams.SITE_OPERAND), else made here (prefill_gemms.SHARED_EXPERT_OPERAND);
        None: each encodes x itself."""
        made = self.encoded_input(x)
        if made is not None and self.parallel.world == 1:  # (made only where the product takes it: _site_operand)
            return made
        if not (prefill_gemms.SHARED_EXPERT_OPERAND and self.act_quant and self.parallel.world == 1
                and _kernels_run_on(x) and prefill_gemms.takes(x)):
            return None
        merged = self._merged_of(shared)
        if not (merged and prefill_gemms.rounds_in_encode(x, *merged[0].shape)):
            return None
        tensors, _ = self._stacked(experts, local)
        return prefill_gemms.expert_rows_operand(x, x.shape[0] * k, len(local), tensors[0])

    def _merge(self, names: tuple[str, ...]) -> tuple | bool:
        weights = [self.weights[name] for name in names]
        if not (len(names) > 1 and all(isinstance(w, Fp8Weight) and w.block == (32, 32) for w in weights)
                and len({w.shape[1] for w in weights}) == 1 and all(w.shape[0] % 32 == 0 for w in weights)):
            return False
        packed = [self._fp8(name)[0] for name in names]
        codes = torch.cat([w.weight for w in packed])
        scales = torch.cat([w.scale for w in packed])
        first = 0
        for stored, w in zip(weights, packed):  # now views of the merged bytes: the separate copies can go
            rows = w.weight.shape[0]
            views = codes[first:first + rows], scales[first // 32:(first + rows) // 32]
            if stored is not w and stored.weight.data_ptr() == w.weight.data_ptr():
                stored.weight, stored.scale = views  # a store on this device holds the same bytes
            w.weight, w.scale = views
            first += rows
        return codes, scales, small_fp8_scales(scales), [w.weight.shape[0] for w in packed]

    def swiglu_linear(self, gate: torch.Tensor, up: torch.Tensor, limit: float, name: str) -> torch.Tensor:
        """A faithful prefill chunk's shared expert on the FP8 tensor cores: the SwiGLU, its
        rounding and the operand's encode in one launch (prefill_gemms.swiglu_fp8_product)."""
        weight = self.weights[name]
        if not (self.act_quant and isinstance(weight, Fp8Weight) and _kernels_run_on(gate)
                and prefill_gemms.swiglu_fits(gate, up, weight.shape[0])):
            return super().swiglu_linear(gate, up, limit, name)
        packed, _ = self._fp8(name)
        return prefill_gemms.swiglu_fp8_product(gate, up, limit, packed.weight, packed.scale, self.weight_cache)

    def gemm_input(self, x: torch.Tensor) -> torch.Tensor:
        """Faithful mode: x on the FP8 grid in one launch (torch's rounding is ~20), as bf16.
        FP8 values times powers of two are exact in bf16, so the GEMM kernels dot it as one
        bf16 part where fp32 activations take three."""
        if not (self.act_quant and _kernels_run_on(x)):
            return super().gemm_input(x)
        return fp8_grid_bf16(x)

    def takes_operand(self, name: str, rows: int, groups: int) -> bool:
        # where grouped_fp8_gemm would round fp32 rows in the operand's encode (rounds_in_encode)
        weight = self.weights[name]
        if not (self.act_quant and isinstance(weight, Fp8Weight)):
            return False
        n, k = weight.weight.shape
        return prefill_gemms.takes_operand(rows, self.device, n // groups, k)

    def grouped_linear(self, x: torch.Tensor | Operand, name: str, groups: int) -> torch.Tensor:
        if isinstance(x, Operand):  # (takes_operand)
            packed, _ = self._fp8(name)
            return prefill_gemms.grouped_fp8_product(x, packed.weight, packed.scale, groups, kept=self.weight_cache)
        if isinstance(self.weights[name], Fp8Weight) and _kernels_run_on(x):
            packed, small = self._fp8(name)
            out = grouped_fp8_gemm(x.contiguous(), packed.weight, packed.scale, groups, small, self.act_quant,
                                   kept=self.weight_cache)
            if out is not None:  # decode rows: one launch on the FP8 bytes, not an fp32 copy
                return out
        return super().grouped_linear(x, name, groups)

    def beside(self, work: Callable[[], T], rows: int) -> Callable[[], T]:
        """work() on the side stream, its split-K GEMMs on their own counts (counts_lane); the
        result waits for it. Memory: every side-stream use starts behind the main stream's work
        so far (wait_stream), so a block the side stream frees is not reused before the main
        stream is done with what it read; the main stream reuses none before the join."""
        if self._side is None or not 0 < rows <= SIDE_STREAM_ROWS:
            return super().beside(work, rows)
        main = torch.cuda.current_stream(self.device)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side), counts_lane(1):
            out = work()

        def joined() -> T:
            main.wait_stream(self._side)
            return out
        return joined

    def top_experts(self, logits: torch.Tensor, temp: float, bias: torch.Tensor, k: int, normalize: bool,
                    scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
        if not (_kernels_run_on(logits) and FUSED_SMALL_OPS and top_experts_fits(logits, k)):
            return super().top_experts(logits, temp, bias, k, normalize, scaling)
        return top_experts(logits, temp, bias, k, normalize, scaling)

    def clamped_swiglu(self, gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
        if not (_kernels_run_on(gate) and FUSED_SMALL_OPS and swiglu.supported(gate, up)):
            return super().clamped_swiglu(gate, up, limit)
        return swiglu.clamped_swiglu(gate, up, limit)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        if not (_kernels_run_on(x) and FUSED_SMALL_OPS and norm_kernel.supported(x)):
            return super().rms_norm(x, weight, eps)
        return norm_kernel.rms_norm(x, weight, eps)

    def hc_mix(self, X: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
               hc_eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kernels = _kernels_run_on(X) and fn.dtype == torch.float32
        if kernels and X.shape[0] >= hc_streams.MIXES_ROWS and hc_streams.supported(X):
            mixes = hc_streams.hc_mixes(X, fn, norm_eps)
        else:
            mixes = hc_mixes(X, fn, norm_eps, fp32_gemm if kernels else None, self.rms_norm)
        return hc_gates(mixes, base, scale, iters, hc_eps)

    def engram_gated(self, X: torch.Tensor, key: torch.Tensor, value: torch.Tensor, wqk: torch.Tensor,
                     eps: float) -> torch.Tensor:
        if not (_kernels_run_on(X) and engram_gate.supported(X, key, value, wqk)):
            return super().engram_gated(X, key, value, wqk, eps)
        return engram_gate.engram_gated(X, key, value, wqk, eps)

    def hc_expand(self, y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        if not (_kernels_run_on(X) and hc_streams.supported(X)):
            return super().hc_expand(y, X, post, comb)
        return hc_streams.hc_expand(y, X, post, comb)

    def defers_expand(self, X: torch.Tensor) -> bool:
        return hc_streams.DEFER_FFN_EXPAND and _one_site_pass(X)

    def hc_expand_mix(self, y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                      fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int, hc_eps: float,
                      norm_eps: float) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        if not (_kernels_run_on(X) and hc_streams.supported(X) and fn.dtype == torch.float32
                and 0 < X.shape[0] <= hc_streams.EXPAND_MIX_ROWS):
            return super().hc_expand_mix(y, X, post, comb, fn, base, scale, iters, hc_eps, norm_eps)
        X, parts, squares = hc_streams.hc_expand_mix_parts(y, X, post, comb, fn)
        return X, hc_gates_from_parts(parts, squares, fn.shape[0], fn.shape[1], base, scale, iters, hc_eps, norm_eps)

    def hc_collapse_norm(self, X: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor | None,
                         eps: float) -> torch.Tensor:
        if not (_kernels_run_on(X) and hc_streams.supported(X)):
            return super().hc_collapse_norm(X, pre, weight, eps)
        return hc_streams.hc_collapse_norm(X, pre, weight, eps)

    def hc_mix_collapse(self, X: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                        iters: int, hc_eps: float, norm_eps: float, pre: torch.Tensor, weight: torch.Tensor | None,
                        encode_for: tuple[str, ...] = (), keep_input: bool = True
                        ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | Operand]:
        self._site_input = None  # (an operand never taken goes with its site)
        if not _one_site_pass(X, fn):
            return super().hc_mix_collapse(X, fn, base, scale, iters, hc_eps, norm_eps, pre, weight)
        _, mixes, x = self._site_pass(X, fn, norm_eps, pre, weight, encode_for, keep_input)
        return hc_gates(mixes, base, scale, iters, hc_eps), x

    def hc_expand_mix_collapse(self, y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                               fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int, hc_eps: float,
                               norm_eps: float, pre: torch.Tensor, weight: torch.Tensor | None,
                               encode_for: tuple[str, ...] = (), keep_input: bool = True
                               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                                          torch.Tensor | Operand]:
        self._site_input = None
        if not _one_site_pass(X, fn):
            return super().hc_expand_mix_collapse(y, X, post, comb, fn, base, scale, iters, hc_eps, norm_eps, pre,
                                                  weight)
        X, mixes, x = self._site_pass(X, fn, norm_eps, pre, weight, encode_for, keep_input, expand=(y, post, comb))
        return X, hc_gates(mixes, base, scale, iters, hc_eps), x

    def _site_pass(self, X: torch.Tensor, fn: torch.Tensor, norm_eps: float, pre: torch.Tensor,
                   weight: torch.Tensor | None, encode_for: tuple[str, ...], keep_input: bool,
                   expand: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | Operand]:
        """hc_streams.hc_site, its input encoded for `encode_for` where _site_operand makes room
        for it (then held for encoded_input), or without keep_input (hc_streams.UNREAD_INPUT_LEFT)
        that operand alone in the input's place."""
        operand = self._site_operand(X, encode_for)
        keep_input = keep_input or operand is None or not hc_streams.UNREAD_INPUT_LEFT
        parts = self._fn_parts(fn) if hc_streams.BF16_DOTS and X.dtype == torch.bfloat16 else None
        if parts is not None and expand is not None and hc_streams.SPLIT_EXPAND:
            X, expand = hc_streams.hc_expand(expand[0], X, *expand[1:]), None
        X, mixes, x = hc_streams.hc_site(X, fn, norm_eps, pre, weight, norm_eps, expand=expand, operand=operand,
                                         keep_input=keep_input, parts=parts)
        self._site_input = (x, operand) if keep_input and operand is not None else None
        return X, mixes, x if keep_input else operand

    def _fn_parts(self, fn: torch.Tensor) -> torch.Tensor:
        """A site's fn as hc_streams.fn_parts gives it, made once per weight where w keeps its
        weights (held with the weight, so that its id stays its own), else at each use."""
        if not self.cache_dense:
            return hc_streams.fn_parts(fn)
        held = self._fn_parts_of.get(id(fn))
        if held is None:
            held = self._fn_parts_of[id(fn)] = (fn, hc_streams.fn_parts(fn))
        return held[1]

    def _site_operand(self, X: torch.Tensor, names: tuple[str, ...]) -> Operand | None:
        """An empty operand for a site's input to fill (hc_streams.SITE_OPERAND), where faithful
        mode's merged FP8 weights `names` would encode that input themselves (takes_operand)."""
        if not (names and self.act_quant and hc_streams.encodes_input(X.shape[2])):
            return None
        merged = self._merged_of(names)
        if not (merged and prefill_gemms.takes_operand(X.shape[0], X.device, *merged[0].shape)):
            return None
        return empty_operand(X.shape[0], X.shape[2], 1, X.device)

    def encoded_input(self, x: torch.Tensor) -> Operand | None:
        held, self._site_input = self._site_input, None
        return held[1] if held is not None and held[0] is x else None

    def fp8_round_trip(self, x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, Packed]:
        if not _kernels_run_on(x):
            return super().fp8_round_trip(x, block)
        return fp8_round_trip(x, block)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False,
             overwrite: bool = False) -> torch.Tensor:
        if not _kernels_run_on(x):
            return super().rope(x, cos, sin, inverse)
        return rope(x, cos, sin, inverse, overwrite)

    def fp4_round_trip(self, x: torch.Tensor, block: int, e4m3_scales: bool = False) -> tuple[torch.Tensor, Packed]:
        if not _kernels_run_on(x):
            return super().fp4_round_trip(x, block, e4m3_scales)
        return fp4_round_trip(x, block, e4m3_scales)

    def compress_pool_norm(self, kv: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, ratio: int,
                           eps: float) -> torch.Tensor:
        if not _kernels_run_on(kv):
            return super().compress_pool_norm(kv, gate, weight, ratio, eps)
        return compressor.pool_norm(kv, gate, weight, ratio, eps)

    def norm_rope_fp4(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block: int,
                      e4m3_scales: bool = False, norm_weight: torch.Tensor | None = None,
                      eps: float = 0.0) -> tuple[torch.Tensor, Packed]:
        if not _kernels_run_on(x):
            return super().norm_rope_fp4(x, cos, sin, block, e4m3_scales, norm_weight, eps)
        return compressor.norm_rope_fp4(x, cos, sin, block, e4m3_scales, norm_weight, eps)

    def keep_encoded_weights(self, budget: int) -> None:
        """Keep up to `budget` bytes of faithful prefill's weights (dense and routed experts, as
        the chunk meets them) re-encoded for the FP8 tensor cores from chunk to chunk
        (prefill_gemms.EncodedWeights; 0: encode every chunk)."""
        self.weight_cache = prefill_gemms.EncodedWeights(budget) if budget > 0 else None

    def routed_experts(self, prefix: str, local: range, x: torch.Tensor, idx: torch.Tensor,
                       weights: torch.Tensor, limit: float, plus: Callable[[], torch.Tensor] | None = None,
                       operand: Operand | None = None) -> torch.Tensor:
        """Pairs routed to this rank's experts `local`; the others are left to their ranks.
        plus: gives [T, H] fp32 to add to every token's sum (the shared expert's output, waited
        for only there): in a prefill chunk's pair sums, else after them. One rank only (each
        rank's shared expert takes its own rows). operand: x encoded already (ffn_operand)."""
        assert plus is None or self.parallel.world == 1, "the shared expert's rows are every row on one rank only"
        tensors, small = self._stacked(prefix, local)
        own = idx  # one rank holds every expert: ids are its own (five kernels fewer a layer)
        if self.parallel.world > 1:  # len(local): not ours, dropped
            own = idx - local.start
            own = torch.where((own >= 0) & (own < len(local)), own, len(local))
        if self.act_quant and _kernels_run_on(x) and not prefill_gemms.takes(x):
            # decode rows: fp4_moe rounds x in the launch that lays out its pieces
            y = fp4_moe(x.contiguous(), own, weights, *tensors, limit, small=small, act_quant=True, round_input=True)
        else:
            if not (self.act_quant and prefill_gemms.takes_expert_rows_operand(x, idx.numel(), len(local),
                                                                               tensors[0])):
                operand = None  # (the pairs take the rounding launch's rows, as before)
            elif operand is None:
                operand = prefill_gemms.expert_rows_operand(x, idx.numel(), len(local), tensors[0])
            rows = self.gemm_input(x).contiguous() if operand is None else operand
            if operand is not None or prefill_gemms.takes_experts(rows, idx.numel(), len(local)):  # cuBLAS
                cache = self.weight_cache
                encoded = None if cache is None else (cache.experts((prefix, "w13")), cache.experts((prefix, "w2")))
                return prefill_gemms.fp4_experts(rows, own, weights, *tensors, limit, act_quant=self.act_quant,
                                                 encoded=encoded, plus=None if plus is None else plus())
            y = fp4_moe(rows, own, weights, *tensors, limit, small=small, act_quant=self.act_quant)
        return y if plus is None else y.add_(plus())

    def stack_all_experts(self, config) -> None:
        """Stack every loaded layer's routed experts now (a prefill tier has no DSpark stages),
        dropping each layer's per-expert tensors as soon as its stack exists: the device holds
        them once, never twice over."""
        local_of = {}
        for role in config.roles:
            if role.n_routed_experts:
                local = self.parallel.split(role.n_routed_experts)
                if f"{role.prefix}.ffn.experts.{local.start}.w1" in self.weights:
                    local_of[f"{role.prefix}.ffn.experts"] = local
        for prefix, local in local_of.items():
            self._stacked(prefix, local)
            self.weights.drop(f"{prefix}.{e}.{w}" for e in local for w in ("w1", "w2", "w3"))

    def _stacked(self, prefix: str, local: range) -> tuple[tuple[torch.Tensor, ...], bool]:
        """A layer's stacked experts and whether their scales are small, stacked on first need."""
        stacked = self._experts.get(prefix)
        if stacked is None:
            tensors = self._stack(prefix, local)
            stacked = self._experts[prefix] = tensors, small_scales(tensors[1], tensors[3])
        return stacked

    def _stack(self, prefix: str, local: range) -> tuple[torch.Tensor, ...]:
        """[E, 2I, H/4] gate+up codes and scales, [E, H, I/4] down, stacked once: the experts'
        own bytes, their codes rearranged as the kernels read them (quad units, on the device,
        an expert at a time)."""
        w13, s13, w2, s2 = [], [], [], []
        for e in local:
            w1: Fp4Weight = self.weights[f"{prefix}.{e}.w1"]
            w3: Fp4Weight = self.weights[f"{prefix}.{e}.w3"]
            down: Fp4Weight = self.weights[f"{prefix}.{e}.w2"]
            w13.append(quad_units(torch.cat([w1.packed, w3.packed]).to(self.device)))
            s13.append(torch.cat([w1.scale, w3.scale]))
            w2.append(quad_units(down.packed.to(self.device)))
            s2.append(down.scale)
        return tuple(torch.stack(t).to(self.device) for t in (w13, s13, w2, s2))


def _wide_prefill(rows: torch.Tensor, weight: torch.Tensor) -> bool:
    """A prefill chunk's rows against a bf16 weight of enough outputs that cuBLAS's three bf16
    parts pay for making them, short of the LM heads (their weight repeated three times along K
    would be 4 GB). Fp32 rows against up to tall_bf16.OUTPUTS outputs (the compressors' 512, the
    routers') take tall_bf16 first."""
    return 256 <= weight.shape[0] < WIDE_OUTPUT and prefill_gemms.takes(rows)


def _one_site_pass(X: torch.Tensor, fn: torch.Tensor | None = None) -> bool:
    """Whether an mHC site's streams X are read once for its mixes and input (hc_streams.SITE_ROWS),
    with its fn where known."""
    return (0 < hc_streams.SITE_ROWS <= X.shape[0] and _kernels_run_on(X) and hc_streams.supported(X)
            and (fn is None or fn.dtype == torch.float32))


def _kernels_run_on(x: torch.Tensor) -> bool:
    """A GPU tensor, or any under the CPU interpreter (how CI runs this path)."""
    return x.is_cuda or interpreting()
