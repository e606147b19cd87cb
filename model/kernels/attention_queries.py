"""The attention's queries as the projection leaves them, rotated where the kernel reads them.

A prefill chunk's queries are [8,192, 64, 512] fp32, 1 GB. Rotating them (RoPE reads and
writes every channel), rounding them to bf16 (faithful mode) and cutting them into the
prefill form's bf16 parts with their columns regrouped were three passes over them; here
they are one (`query_parts`). Every value is rounded as those passes round it: RoPE's two
products and their sum, then the parts of the rotated fp32 value (the first part is the
bf16 cast). The decode form reads rotated queries (`Queries.rotated`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import triton
import triton.language as tl

from . import pdl
from .common import bf16_rne, interpreting
from .rope import rope, rope_values

_PTX = tl.constexpr(not interpreting())
# Off: sparse_attention rotates Queries first and cuts the parts from the rotated tensor, as
# before this module (bench/prefill_passes.py times both in one process).
ONE_PASS = True


# Faithful prefill's queries leave wq_b in two products (SPLIT_QUERIES; TritonOps.attention_queries,
# prefill_gemms.query_halves_product): each head's first PLAIN channels, which RoPE does not
# turn, in bf16 (the attention reads them as bf16 values: the same bits as rounding the fp32
# product, which the Gluon rows kernel did as it read them), and the rest of its last 128-row
# weight block (its other plain channels and the rotated ones) in fp32 before RoPE. At a 16K
# chunk that is 1.3 GB written and read where the fp32 queries were 2.1 (bench/query_bytes.py
# times both sides). Any form but the Gluon rows kernel takes them joined (Queries.joined).
# H100, fifty-ninth session (call BE): the same bits on the GPU (cuBLAS's bf16 output is its
# fp32 output rounded; the rows kernel's outputs and operand; a faithful prefill's logits), and
# within the noise: a 256K faithful prefill off / on 9.583 / 9.490 s, 128K on / off / on
# 4.586 / 4.681 / 4.725 s, the same last logits. Sixtieth session (call BF, H100): a 1M faithful
# prefill in 16K chunks 46.71 -> 46.35 s in one process, its last chunks 0.898 / 0.903 / 1.004
# -> 0.880 / 0.887 / 0.958 s, the same last logits: on.
SPLIT_QUERIES = True
PLAIN = 384  # a multiple of the weight's 128-row scale blocks, short of the rotated channels


class QueryHalves(NamedTuple):
    """wq_b's output of a faithful prefill chunk in two tensors (SPLIT_QUERIES): plain [n, h,
    P] bf16, the channels RoPE leaves alone, and tail [n, h, D - P] fp32 before RoPE."""
    plain: torch.Tensor
    tail: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        n, heads, p = self.plain.shape
        return n, heads, p + self.tail.shape[2]

    def whole(self) -> torch.Tensor:
        """The fp32 queries [n, h, D] these stand for (the plain channels exact in fp32)."""
        return torch.cat([self.plain.float(), self.tail], dim=-1)


def whole_queries(q_all: torch.Tensor | QueryHalves) -> torch.Tensor:
    """q_all as one fp32 tensor [n, h, D], for the paths that read it so."""
    return q_all.whole() if isinstance(q_all, QueryHalves) else q_all


class Queries(NamedTuple):
    """Queries [n, h, D] before RoPE, with each row's cos and sin [n, half]; bf16: they attend
    as bf16 values (faithful mode: ReferenceOps.attention_query). With a tail (QueryHalves),
    raw holds only the first P channels, in bf16, and tail [n, h, D - P] fp32 the rest."""
    raw: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    bf16: bool
    tail: torch.Tensor | None = None

    @staticmethod
    def of(q_all: torch.Tensor | QueryHalves, cos: torch.Tensor, sin: torch.Tensor, bf16: bool) -> "Queries":
        """The attention's queries from the projection's output, whole or in halves."""
        if isinstance(q_all, QueryHalves):
            assert bf16, "only faithful mode's queries come in halves"
            return Queries(q_all.plain, cos, sin, bf16, q_all.tail)
        return Queries(q_all, cos, sin, bf16)

    @property
    def shape(self) -> tuple[int, int, int]:
        n, heads, dim = self.raw.shape
        return n, heads, dim + (0 if self.tail is None else self.tail.shape[2])

    def joined(self) -> "Queries":
        """The same queries with raw whole in fp32 (themselves where they have no tail)."""
        if self.tail is None:
            return self
        return Queries(QueryHalves(self.raw, self.tail).whole(), self.cos, self.sin, self.bf16)

    def take(self, rows: Callable[[torch.Tensor], torch.Tensor]) -> "Queries":
        """The same rows of the queries and of their cos and sin (`rows` picks them from any)."""
        tail = None if self.tail is None else rows(self.tail)
        return Queries(rows(self.raw), rows(self.cos), rows(self.sin), self.bf16, tail)

    def for_kernel(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(raw, cos, sin) as the kernels that rotate them read them: rows of contiguous
        channels, fp32 angles in contiguous rows."""
        raw = self.raw if self.raw.stride(-1) == 1 else self.raw.contiguous()
        return raw, self.cos.float().contiguous(), self.sin.float().contiguous()

    def rotated(self) -> torch.Tensor:
        """What ReferenceOps.attention_query returns for them."""
        whole = self.joined()
        q = rope(whole.raw, self.cos, self.sin)
        return q.to(torch.bfloat16) if self.bf16 else q


@triton.jit
def _rope_parts_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, total, H, sxn, sxh, scn, sop,
                       D: tl.constexpr, HALF: tl.constexpr, SPLITS: tl.constexpr, G: tl.constexpr,
                       BLOCK: tl.constexpr, PTX: tl.constexpr, PDL: tl.constexpr):
    """Elements e of x [n, H, D] (flattened) -> RoPE -> their SPLITS bf16 parts at
    out[p, e // D, (col % G) * (D / G) + col // G]."""
    pdl.wait_for_inputs(PDL)
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = e < total
    row = e // D
    col = e % D
    token = row // H
    rest = rope_values(x_ptr + token * sxn + (row % H) * sxh, col, cos_ptr + token * scn, sin_ptr + token * scn,
                       live, D, HALF, False, PTX)
    at = out_ptr + row * D + (col % G) * (D // G) + col // G
    for p in tl.static_range(SPLITS):
        head = bf16_rne(rest)  # the cast of the rounded value is exact everywhere
        tl.store(at + p * sop, head.to(tl.bfloat16), mask=live)
        rest = rest - head


def query_parts(q: Queries, splits: int, interleave: int) -> torch.Tensor:
    """bf16_parts(q.rotated(), splits, interleave) in one launch: [splits, n, h, D] bf16."""
    q = q.joined()
    n, heads, D = q.raw.shape
    half = q.cos.shape[-1]
    assert q.cos.shape == q.sin.shape == (n, half) and 2 * half <= D and D % 2 == 0 and D % interleave == 0
    x, cos, sin = q.for_kernel()
    out = torch.empty(splits, n, heads, D, dtype=torch.bfloat16, device=x.device)
    total = out[0].numel()
    if total:
        block = 1024
        _rope_parts_kernel[(triton.cdiv(total, block),)](x, cos, sin, out, total, heads, x.stride(0), x.stride(1),
                                                         cos.stride(0), total, D=D, HALF=half, SPLITS=splits,
                                                         G=interleave, BLOCK=block, PTX=_PTX, **pdl.options(x.device))
    return out
