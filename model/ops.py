"""How the model touches its weights: one object, so a fast path can replace the reference one.

`ReferenceOps` computes in fp32 on exactly dequantized weights. In faithful mode
(`act_quant=True`) the input of every FP8/FP4-weight GEMM is first rounded to FP8 in 1x32
blocks, as the reference inference code does; BF16-weight GEMMs (compressor, indexer keys
and weights, router, heads) take the input as it is. Its attention also computes as the
reference's kernel does: bf16 queries, and bf16 probabilities in the weighted sum of the values.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

from . import quant
from .kernels.attention_queries import QueryHalves
from .kernels.compressor import norm_rope_fp4_ref, pool_norm_ref
from .kernels.swiglu import clamped_swiglu_ref
from .kernels.top_experts import top_experts_ref
from .layers.engram_gate import engram_gated
from .layers.mhc import hc_collapse, hc_expand, hc_mix
from .layers.norm import rms_norm
from .parallel import SINGLE, Parallel
from .rope import apply_rope
from .weights import Fp4Weight, Fp8Weight, WeightStore

T = TypeVar("T")  # what ops.beside's work returns


class ReferenceOps:
    fast = False  # TritonOps: layers take their kernel paths

    def __init__(self, weights: WeightStore, act_quant: bool = False, device: str | torch.device = "cpu",
                 cache_dense: bool = True, parallel: Parallel = SINGLE):
        self.weights = weights
        self.parallel = parallel  # this rank's heads and experts (model/parallel.py)
        self.act_quant = act_quant
        self.device = torch.device(device)
        self.cache_dense = cache_dense  # False: dequantize at every use (weights too big to keep in fp32)
        self._dense: dict[str, torch.Tensor] = {}

    def w(self, name: str) -> torch.Tensor:
        """fp32 value of a weight on the compute device (dequantized once, unless cache_dense is off)."""
        t = self._dense.get(name)
        if t is None:
            w = self.weights[name]
            t = (w.float() if isinstance(w, torch.Tensor) else w.dequantize()).to(self.device)
            if self.cache_dense:
                self._dense[name] = t
        return t

    def rows(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """fp32 rows `ids` of an embedding table, read from the table as stored (a table of the
        whole vocabulary is not worth an fp32 copy: 2.6 GB in the release)."""
        table = self._dense.get(name, self.weights[name])
        return table[ids.to(table.device)].float().to(self.device)

    def reads_cache_in_place(self, cache) -> bool:
        """The kernel paths read a paged cache's bytes where they lie, so its pool must sit on
        this device (a worker with a host-memory pool keeps the gathering reference path)."""
        return self.fast and hasattr(cache, "entry_offsets") and same_device(cache.pool.device, self.device)

    def has(self, name: str) -> bool:
        return name in self.weights

    def is_quantized(self, name: str) -> bool:
        return isinstance(self.weights[name], (Fp8Weight, Fp4Weight))

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ W.T in fp32; FP8/FP4 weights see an FP8-rounded input in faithful mode."""
        if self.is_quantized(name):
            x = self.gemm_input(x)
        return x.float() @ self.w(name).T

    def attention_queries(self, x: torch.Tensor, name: str, heads: int, dim: int, plain: int = 0
                          ) -> torch.Tensor | QueryHalves:
        """The attention's queries [T, heads, dim] before RoPE, x @ wq_b.T; where plain > 0 the
        fast path may return them in halves instead (QueryHalves, attention_queries.SPLIT_QUERIES:
        each head's first `plain` channels, which RoPE leaves alone, in bf16)."""
        return self.linear(x, name).view(-1, heads, dim)

    def linear_many(self, x: torch.Tensor, names: tuple[str, ...]) -> list[torch.Tensor]:
        """x @ W.T for several weights that read the same input (the fast path runs them as one
        GEMM where it can)."""
        return [self.linear(x, name) for name in names]

    def ffn_operand(self, x: torch.Tensor, experts: str, local: range, k: int, shared: tuple[str, ...]):
        """The FFN's rows x encoded once for the shared and the routed experts (the fast path's
        faithful prefill); None: each takes x."""
        return None

    def gemm_input(self, x: torch.Tensor) -> torch.Tensor:
        """x as an FP8/FP4-weight GEMM takes it: rounded onto the FP8 grid in faithful mode."""
        return quant.fake_quant_fp8(x) if self.act_quant else x

    def grouped_linear(self, x: torch.Tensor, name: str, groups: int) -> torch.Tensor:
        """x [T, G*K] -> [T, G*R] through a block-diagonal weight [G*R, K]: group g's R rows see
        only x's g-th K columns (the attention output's wo_a); an FP8 weight sees an FP8-rounded
        input in faithful mode, as in linear."""
        if self.is_quantized(name):
            x = self.gemm_input(x)
        w = self.w(name)
        out = torch.einsum("tgi,gri->tgr", x.float().view(x.shape[0], groups, -1), w.view(groups, -1, w.shape[-1]))
        return out.reshape(x.shape[0], -1)

    def takes_operand(self, name: str, rows: int, groups: int) -> bool:
        """Whether grouped_linear of `rows` fp32 rows through this weight also takes its FP8
        operand already encoded by the launch that computed the rows (fp8_blockwise.Operand:
        the fast path's faithful prefill)."""
        return False

    def fp8_round_trip(self, x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, quant.Packed]:
        """x [..., n] on the FP8 grid (window KV) and the codes and scale bytes a cache stores."""
        return quant.fp8_round_trip(x, block)

    def fp4_round_trip(self, x: torch.Tensor, block: int, e4m3_scales: bool = False
                       ) -> tuple[torch.Tensor, quant.Packed]:
        """x [..., n] on the FP4 grid (compressed entries and index keys) and its packed codes and scale bytes."""
        return quant.fp4_round_trip(x, block, e4m3_scales)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False,
             overwrite: bool = False) -> torch.Tensor:
        """RoPE on the last 2*cos.shape[-1] channels (model/rope.py); one launch on the fast path,
        which with `overwrite` (x is a temporary) rotates x in place."""
        return apply_rope(x, cos, sin, inverse)

    def attention_query(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The attention's queries after RoPE; in faithful mode bf16, as the reference inference
        holds them, so that they attend as its kernel does (sparse_attention_ref: P.V on bf16
        probabilities)."""
        q = self.rope(q, cos, sin)
        return q.to(torch.bfloat16) if self.act_quant else q

    def compress_pool_norm(self, kv: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor, ratio: int,
                           eps: float) -> torch.Tensor:
        """The compressor's latent [G, D]: each group's `ratio` rows pooled by a per-channel softmax
        of their gates, RMS-normalized (kernels/compressor.py); one launch on the fast path."""
        return pool_norm_ref(kv, gate, weight, ratio, eps)

    def norm_rope_fp4(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block: int,
                      e4m3_scales: bool = False, norm_weight: torch.Tensor | None = None,
                      eps: float = 0.0) -> tuple[torch.Tensor, quant.Packed]:
        """fp4_round_trip(rope(x)), x RMS-normalized first when norm_weight is given: compressed
        entries and index keys; one launch on the fast path."""
        return norm_rope_fp4_ref(x, cos, sin, block, e4m3_scales, norm_weight, eps)

    def fake_quant_fp4(self, x: torch.Tensor, block: int, e4m3_scales: bool = False) -> torch.Tensor:
        """x on the FP4 grid (indexer queries), through this object's fp4_round_trip."""
        return quant.fake_quant_fp4(x, block, e4m3_scales, round_trip=self.fp4_round_trip)

    def top_experts(self, logits: torch.Tensor, temp: float, bias: torch.Tensor, k: int, normalize: bool,
                    scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The router's weights [T, k] and expert ids [T, k] from its logits [T, E] (layers/moe.py,
        kernels/top_experts.py); one launch on the fast path."""
        return top_experts_ref(logits, temp, bias, k, normalize, scaling)

    def beside(self, work: Callable[[], T], rows: int) -> Callable[[], T]:
        """work(), which the fast path may run beside what is enqueued after it (a side stream):
        the returned function gives its result, joined to the work after it. Here, at once."""
        out = work()
        return lambda: out

    def clamped_swiglu(self, gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
        """silu(min(gate, L)) * clamp(up, -L, L) (layers/moe.py); one launch on the fast path."""
        return clamped_swiglu_ref(gate, up, limit)

    def swiglu_linear(self, gate: torch.Tensor, up: torch.Tensor, limit: float, name: str) -> torch.Tensor:
        """linear(clamped_swiglu(gate, up, limit), name): the shared expert's down projection
        (the fast path may never write the SwiGLU's output)."""
        return self.linear(self.clamped_swiglu(gate, up, limit), name)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        """RMSNorm in fp32 (layers/norm.py); one launch on the fast path."""
        return rms_norm(x, weight, eps)

    def hc_mix(self, X: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
               hc_eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An mHC site's gates (layers/mhc.py); the fast path fuses the Sinkhorn loop."""
        return hc_mix(X, fn, base, scale, iters, hc_eps, norm_eps)

    def engram_gated(self, X: torch.Tensor, key: torch.Tensor, value: torch.Tensor, wqk: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """Engram's gated value added to the streams (layers/engram_gate.py); one launch on the
        fast path."""
        return engram_gated(X, key, value, wqk, eps)

    def hc_expand(self, y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """A sublayer's output into the streams (layers/mhc.py); one launch on the fast path."""
        return hc_expand(y, X, post, comb)

    def defers_expand(self, X: torch.Tensor) -> bool:
        """Whether a block's FFN output should go into the streams X inside the next block's
        attention site (hc_expand_mix_collapse) rather than in a pass of its own: where that
        site reads the streams once anyway (the fast path's prefill rows)."""
        return False

    def hc_expand_mix(self, y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                      fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int, hc_eps: float,
                      norm_eps: float) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """hc_expand, then the next site's hc_mix of the new streams: (streams, (pre, post, comb));
        the fast path's decode rows take both in two launches (hc_streams.hc_expand_mix_parts)."""
        X = self.hc_expand(y, X, post, comb)
        return X, self.hc_mix(X, fn, base, scale, iters, hc_eps, norm_eps)

    def hc_collapse_norm(self, X: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor | None,
                         eps: float) -> torch.Tensor:
        """A sublayer's input: the streams collapsed by `pre`, RMS-normalized; one launch on the fast path."""
        return rms_norm(hc_collapse(X, pre), weight, eps)

    def hc_mix_collapse(self, X: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                        iters: int, hc_eps: float, norm_eps: float, pre: torch.Tensor, weight: torch.Tensor | None,
                        encode_for: tuple[str, ...] = (), keep_input: bool = True
                        ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """A site's gates (hc_mix) and its input (hc_collapse_norm by the previous site's `pre`),
        both of the same streams: (gates, input); the fast path's prefill rows read them once.
        encode_for: the merged FP8 weights whose product reads this input first: the fast path
        may encode the input for them in the same pass (encoded_input). keep_input False: that
        product is all that reads it, so where the pass encodes it, the fast path may return
        that operand (an fp8_blockwise.Operand) in the input's place and never write the input."""
        return self.hc_mix(X, fn, base, scale, iters, hc_eps, norm_eps), self.hc_collapse_norm(X, pre, weight, norm_eps)

    def hc_expand_mix_collapse(self, y: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                               fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int, hc_eps: float,
                               norm_eps: float, pre: torch.Tensor, weight: torch.Tensor | None,
                               encode_for: tuple[str, ...] = (), keep_input: bool = True
                               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """hc_expand_mix, then the next site's input from the new streams (hc_collapse_norm by
        `pre`): (streams, gates, input); the fast path's prefill rows make all three in one pass.
        encode_for, keep_input: as hc_mix_collapse's."""
        X, gates = self.hc_expand_mix(y, X, post, comb, fn, base, scale, iters, hc_eps, norm_eps)
        return X, gates, self.hc_collapse_norm(X, pre, weight, norm_eps)

    def encoded_input(self, x: torch.Tensor):
        """The FP8 operand the last mHC site made of its input x for its encode_for weights (an
        fp8_blockwise.Operand), or None: they take x. Handed out once: the first call after the
        site takes it, whichever tensor it asks for (another tensor's call drops it unused)."""
        return None


def same_device(a: str | torch.device, b: str | torch.device) -> bool:
    """'cuda' and 'cuda:0' are the same GPU when 0 is the current one."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device()
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)


ARGMAX_PARTS = 128  # a row's parts in argmax_rows' first stage (0: torch's one-stage argmax)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1) (the first of equal maxima; a NaN above every number, the first NaN of
    several), in two stages: each of ARGMAX_PARTS parts of a row its max and where, then the
    first part holding the row's. torch reduces a row in one block: an LM head's 129,280
    logits took 27 us on the H200 (a step's drafter takes five of them), the stages spread
    over many blocks. max(dim) and argmax break ties and NaNs alike, so the two agree."""
    width = x.shape[-1]
    if not ARGMAX_PARTS or width % ARGMAX_PARTS or width < 2 * ARGMAX_PARTS:
        return x.argmax(-1)
    best, where = x.unflatten(-1, (ARGMAX_PARTS, width // ARGMAX_PARTS)).max(-1)
    part = best.argmax(-1, keepdim=True)
    return (part * (width // ARGMAX_PARTS) + where.gather(-1, part)).squeeze(-1)
