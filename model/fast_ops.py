"""The fast path: weights stay packed on the device, heavy ops run as Triton kernels.

Same interface as ReferenceOps (layers ask `ops.fast` to pick kernel paths), same math:
every kernel is checked against the reference it replaces (tests/model/test_kernels.py).
- FP8 GEMMs decode their 32x32-block weights in registers (fp8_gemm);
- routed experts run as two grouped GEMMs over packed FP4 weights (fp4_moe);
- attention and indexer scoring read the paged cache's bytes in place (their layers call them);
- the FP8/FP4 cache round trips run as one launch each (quantize), not ~25 small torch ops.
"""

from __future__ import annotations

import torch

from .kernels.common import interpreting
from .kernels.fp4_moe import fp4_moe
from .kernels.fp8_gemm import fp8_gemm
from .kernels.hc_gates import hc_gates
from .kernels.quantize import fp4_round_trip, fp8_round_trip
from .layers.mhc import hc_mixes
from .ops import ReferenceOps
from .parallel import SINGLE, Parallel
from .quant import Packed
from .weights import Fp4Weight, Fp8Weight, WeightStore


class TritonOps(ReferenceOps):
    fast = True

    def __init__(self, weights: WeightStore, act_quant: bool = False, device: str | torch.device = "cuda",
                 parallel: Parallel = SINGLE):
        super().__init__(weights, act_quant=act_quant, device=device, parallel=parallel)
        self._packed: dict[str, Fp8Weight] = {}
        self._experts: dict[str, tuple[torch.Tensor, ...]] = {}

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        weight = self.weights[name]
        if not isinstance(weight, Fp8Weight):
            return super().linear(x, name)
        packed = self._packed.get(name)
        if packed is None:
            packed = self._packed[name] = weight.to(self.device)
        return fp8_gemm(x.contiguous(), packed.weight, packed.scale, act_quant=self.act_quant)

    def hc_mix(self, X: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, iters: int,
               hc_eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return hc_gates(hc_mixes(X, fn, norm_eps), base, scale, iters, hc_eps)

    def fp8_round_trip(self, x: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, Packed]:
        if not _kernels_run_on(x):
            return super().fp8_round_trip(x, block)
        return fp8_round_trip(x, block)

    def fp4_round_trip(self, x: torch.Tensor, block: int, e4m3_scales: bool = False) -> tuple[torch.Tensor, Packed]:
        if not _kernels_run_on(x):
            return super().fp4_round_trip(x, block, e4m3_scales)
        return fp4_round_trip(x, block, e4m3_scales)

    def routed_experts(self, prefix: str, local: range, x: torch.Tensor, idx: torch.Tensor,
                       weights: torch.Tensor, limit: float) -> torch.Tensor:
        """Pairs routed to this rank's experts `local`; the others are left to their ranks."""
        stacked = self._experts.get(prefix)
        if stacked is None:
            stacked = self._experts[prefix] = self._stack(prefix, local)
        if self.act_quant:
            from .quant import fake_quant_fp8

            x = fake_quant_fp8(x)
        own = idx - local.start
        own = torch.where((own >= 0) & (own < len(local)), own, len(local))  # len(local): not ours, dropped
        return fp4_moe(x.contiguous(), own, weights, *stacked, limit)

    def _stack(self, prefix: str, local: range) -> tuple[torch.Tensor, ...]:
        """[E, 2I, H/2] gate+up codes and scales, [E, H, I/2] down: the experts' own bytes, stacked once."""
        w13, s13, w2, s2 = [], [], [], []
        for e in local:
            w1: Fp4Weight = self.weights[f"{prefix}.{e}.w1"]
            w3: Fp4Weight = self.weights[f"{prefix}.{e}.w3"]
            down: Fp4Weight = self.weights[f"{prefix}.{e}.w2"]
            w13.append(torch.cat([w1.packed, w3.packed]))
            s13.append(torch.cat([w1.scale, w3.scale]))
            w2.append(down.packed)
            s2.append(down.scale)
        return tuple(torch.stack(t).to(self.device) for t in (w13, s13, w2, s2))


def _kernels_run_on(x: torch.Tensor) -> bool:
    """A GPU tensor, or any under the CPU interpreter (how CI runs this path)."""
    return x.is_cuda or interpreting()
