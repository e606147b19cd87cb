"""CUDA graphs of the dense parts of a forward, one per (part, layer, rows).

A decode step launches thousands of small kernels, and on the H200 the host's launch work, not
the GPU, sets its time. The dense parts of each mHC block (the gates, norms, projections,
router, experts) have shapes that depend only on the number of rows, so each is captured once
per row count and then replayed as a single launch. Once a layer's entry lists are full
(index_topk) its attention's shapes depend only on the rows too, so at decode a layer with
neither compressor nor indexer is one graph (DeepseekV41.block), as is a DSpark stage, and a
compressor or indexer layer two: its projections ("attn_in"), then its attention with the
FFN ("attn_ffn"), with the compressor and indexer eager between them (their shapes follow
each cache). The Engram sites are graphs too, and so are the drafter's absorb (per bucket
of row counts, captured at the decode worker's warm-up) and its greedy head with the Markov
loop (model/dspark.py): run eagerly, each cost the host more than its GPU time, and the GPU
waited.

Graphs are kept per batch-size bucket, not per row count: when every request of a forward
has the same rows (decode's verify blocks, the drafter's blocks), the batch is padded up to
the next bucket (BATCH_BUCKETS) by repeating its last row, so a batch of 5 replays the graphs
of 8 and a continuously changing batch does not capture a new set at every size. The padded
rows are exact copies of the last real one all the way through (every part computes row by
row), so where they write (the window ring) they write its bytes to its place.

A part runs eagerly the first time its key is seen (Triton compiles, weights are packed and
cached), and is captured the second time. A part that cannot be captured (it synchronizes
with the host, say) runs eagerly from then on. Replays are bitwise the eager run: the same
kernels on the same shapes (tests/model/test_cuda_graphs.py).

A replay copies its inputs into the graph's own buffers, and at batch 1 those copies were a
large part of the host's work. Two kinds need none: an input that is another graph's output
(one block's streams are the next one's input) is read where that graph writes it, and an
input shared by many graphs of one forward (RoPE tables, ring offsets) is copied once into a
buffer they all read, not once per graph.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

Tensors = tuple[torch.Tensor, ...]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: Tensors  # the graph reads these: a replay copies the call's inputs into them
    outputs: Tensors  # and writes these, valid until this graph's next replay


_EAGER = object()  # a key that failed to capture

# The Engram sites and the drafter's absorb and greedy head run as graphs (off: eagerly; a
# switch for bench/decode_ab.py). Eagerly each cost the host more than its GPU time.
HOST_BOUND_PARTS = True

# Request counts a padded batch rounds up to: few buckets where a batch is small and its
# rows cheap to pad, then every 8 (vLLM's capture sizes run the same way).
BATCH_BUCKETS = (1, 2, 4, 8)


def batch_bucket(requests: int) -> int:
    """The request count a batch of `requests` equal runs is padded to."""
    for bucket in BATCH_BUCKETS:
        if requests <= bucket:
            return bucket
    return -(-requests // 8) * 8


class GraphCache:
    def __init__(self, max_rows: int = 256):
        self.max_rows = max_rows
        self._entries: dict[tuple, object] = {}
        self._pool = None  # one memory pool: parts replay one after another, never at once
        self._outputs: dict[tuple, torch.Tensor] = {}  # (address, shape, strides, dtype) -> a captured output
        self._shared: dict[tuple, torch.Tensor] = {}  # (slot from the end, shape, dtype) -> buffer graphs read
        self._shared_from: dict[int, torch.Tensor] = {}  # buffer address -> the tensor last copied in
        self._sources: dict[tuple, torch.Tensor] = {}  # (rows, padded rows) -> the row each padded row copies

    @staticmethod
    def wanted(device: torch.device) -> bool:
        """On a GPU unless DSFLASH_CUDA_GRAPHS=0. With several ranks the graphs capture their
        NCCL all-reduces too: every rank captures the same parts on the same call, since the
        ranks run the same calls (model/lockstep.py)."""
        return device.type == "cuda" and os.environ.get("DSFLASH_CUDA_GRAPHS", "1") != "0"

    def run(self, key: tuple, fn: Callable[..., Tensors], inputs: Tensors, shared: int = 0,
            unit: int = 0) -> Tensors:
        """fn(*inputs), replayed from a graph when this key was seen before. The returned
        tensors belong to the graph: use them before this key runs again. Every input has one
        row per token of the forward. The last `shared` inputs are the same for many graphs of
        a forward and never change in place once made (a new forward makes new ones): graphs
        read them from buffers shared by input slot. `unit`: the rows of each request when all
        have the same (the batch is then padded to its bucket), else 0."""
        rows = inputs[0].shape[0]
        padded = self.padded_rows(rows, unit)
        if padded > self.max_rows:
            return fn(*inputs)
        key = key + tuple((padded,) + tuple(t.shape[1:]) + (t.dtype,) for t in inputs)  # (bf16 or fp32 streams)
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = "warm"
            return fn(*inputs)
        first_shared = len(inputs) - shared
        if entry == "warm":
            entry = self._entries[key] = self._capture(key, fn, inputs, first_shared, padded)
        if entry is _EAGER:
            return fn(*inputs)
        for slot, (static, given) in enumerate(zip(entry.inputs, inputs)):
            if slot >= first_shared:
                if self._shared_from.get(static.data_ptr()) is not given:
                    self._fill(static, given)
                    self._shared_from[static.data_ptr()] = given
            elif not _rows_of(static, given):
                self._fill(static, given)
        entry.graph.replay()
        return entry.outputs if padded == rows else tuple(t[:rows] for t in entry.outputs)

    def padded_rows(self, rows: int, unit: int) -> int:
        """The rows a forward of `rows` (`unit` a request, see run) is launched with."""
        padded = unit * batch_bucket(rows // unit) if unit and rows % unit == 0 else rows
        return padded if padded <= self.max_rows else rows

    def _fill(self, static: torch.Tensor, given: torch.Tensor) -> None:
        """Copy `given` into a graph's buffer, its last row repeated down the padding."""
        rows, padded = given.shape[0], static.shape[0]
        if rows == padded:
            static.copy_(given)
            return
        source = self._sources.get((rows, padded, given.device))
        if source is None:
            source = torch.arange(padded, device=given.device).clamp_(max=rows - 1)
            self._sources[(rows, padded, given.device)] = source
        torch.index_select(given, 0, source, out=static)

    def _static(self, slot: int, t: torch.Tensor, first_shared: int, padded: int, count: int) -> torch.Tensor:
        """The buffer a graph reads input `slot` of `count` from (see the module's docstring).
        Shared inputs come last, so their buffers are keyed by the place from the end: graphs
        of different parts then read one buffer per kind of shared input (a whole block and
        the attention of a compressor layer take the same prepared offsets)."""
        shape = (padded,) + tuple(t.shape[1:])
        if slot >= first_shared:
            buffer = self._shared.setdefault((count - slot, shape, t.dtype), t.new_empty(shape))
            self._fill(buffer, t)
            self._shared_from[buffer.data_ptr()] = t
            return buffer
        address = _address(t)
        whole = self._outputs.get((address[0], shape) + address[2:])
        if whole is not None:  # another graph's output (its padded rows included): read it there
            return whole
        buffer = t.new_empty(shape)
        self._fill(buffer, t)
        return buffer

    def _capture(self, key: tuple, fn: Callable[..., Tensors], inputs: Tensors, first_shared: int, padded: int):
        static = tuple(self._static(slot, t, first_shared, padded, len(inputs)) for slot, t in enumerate(inputs))
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = fn(*static)
        except Exception as exc:  # e.g. a host sync inside: this part stays eager
            log.warning("CUDA graph capture of %s failed, running it eagerly: %s", key[:2], exc)
            torch.cuda.synchronize()
            return _EAGER
        # The capture recorded the work without running it: replay once so that `outputs`
        # hold this call's values.
        graph.replay()
        self._outputs.update((_address(t), t) for t in outputs)
        return _Captured(graph, static, tuple(outputs))

    def release(self) -> None:
        """Free every captured graph now, not when the last reference goes: NCCL's teardown
        (destroy_process_group) waits on the collectives that live graphs captured (measured:
        it hung until they were gone)."""
        for entry in self._entries.values():
            if isinstance(entry, _Captured):
                entry.graph.reset()
        self._entries.clear()
        self._outputs.clear()
        self._shared.clear()
        self._shared_from.clear()
        self._sources.clear()

    def captured(self, part: str | None = None) -> int:
        """How many graphs were captured (of one part: "attn_in", "attn_out_ffn", "attn_ffn", "block",
        "engram", and the drafter's "absorb", "propose" and "draft_head")."""
        return sum(isinstance(entry, _Captured) and part in (None, key[0]) for key, entry in self._entries.items())


def _address(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape), t.stride(), t.dtype


def _rows_of(static: torch.Tensor, given: torch.Tensor) -> bool:
    """given is static's first rows (static is another graph's output, read where it lies):
    the copy would read and write the same bytes. Its padded rows were computed from the
    same repeated row, so they already hold what a fill would put there."""
    a, b = _address(static), _address(given)
    return a[0] == b[0] and a[1][1:] == b[1][1:] and a[2:] == b[2:] and given.shape[0] <= static.shape[0]
