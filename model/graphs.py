"""CUDA graphs of the dense parts of a forward, one per (part, layer, rows).

A decode step launches thousands of small kernels, and on the H200 the host's launch work, not
the GPU, sets its time. The dense parts of each mHC block (the gates, norms, projections,
router, experts) have shapes that depend only on the number of rows, so each is captured once
per row count and then replayed as a single launch. In a layer with neither compressor nor indexer the attention's
shapes depend only on the rows too once its entry lists are full (index_topk), so at decode
the whole block is one graph (DeepseekV41.block); the compressor and indexer layers keep
their attention eager between two graphs: their shapes follow each cache.

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


class GraphCache:
    def __init__(self, max_rows: int = 256):
        self.max_rows = max_rows
        self._entries: dict[tuple, object] = {}
        self._pool = None  # one memory pool: parts replay one after another, never at once
        self._outputs: set[tuple] = set()  # (address, shape, strides) of every captured output
        self._shared: dict[tuple, torch.Tensor] = {}  # (slot, shape, dtype) -> buffer graphs read
        self._shared_from: dict[int, torch.Tensor] = {}  # buffer address -> the tensor last copied in

    @staticmethod
    def wanted(device: torch.device) -> bool:
        """On a GPU unless DSFLASH_CUDA_GRAPHS=0. With several ranks the graphs capture their
        NCCL all-reduces too: every rank captures the same parts on the same call, since the
        ranks run the same calls (model/lockstep.py)."""
        return device.type == "cuda" and os.environ.get("DSFLASH_CUDA_GRAPHS", "1") != "0"

    def run(self, key: tuple, fn: Callable[..., Tensors], inputs: Tensors, shared: int = 0) -> Tensors:
        """fn(*inputs), replayed from a graph when this key was seen before. The returned
        tensors belong to the graph: use them before this key runs again. The last `shared`
        inputs are the same for many graphs of a forward and never change in place once made
        (a new forward makes new ones): graphs read them from buffers shared by input slot."""
        if inputs[0].shape[0] > self.max_rows:
            return fn(*inputs)
        key = key + tuple(tuple(t.shape) for t in inputs)
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = "warm"
            return fn(*inputs)
        first_shared = len(inputs) - shared
        if entry == "warm":
            entry = self._entries[key] = self._capture(key, fn, inputs, first_shared)
        if entry is _EAGER:
            return fn(*inputs)
        for slot, (static, given) in enumerate(zip(entry.inputs, inputs)):
            if slot >= first_shared:
                if self._shared_from.get(static.data_ptr()) is not given:
                    static.copy_(given)
                    self._shared_from[static.data_ptr()] = given
            elif not _same_memory(static, given):
                static.copy_(given)
        entry.graph.replay()
        return entry.outputs

    def _static(self, slot: int, t: torch.Tensor, first_shared: int) -> torch.Tensor:
        """The buffer a graph reads input `slot` from (see the module's docstring)."""
        if slot >= first_shared:
            buffer = self._shared.setdefault((slot, tuple(t.shape), t.dtype), torch.empty_like(t))
            buffer.copy_(t)
            self._shared_from[buffer.data_ptr()] = t
            return buffer
        if _address(t) in self._outputs:
            return t
        return t.clone()

    def _capture(self, key: tuple, fn: Callable[..., Tensors], inputs: Tensors, first_shared: int):
        static = tuple(self._static(slot, t, first_shared) for slot, t in enumerate(inputs))
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
        self._outputs.update(_address(t) for t in outputs)
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

    def captured(self, part: str | None = None) -> int:
        """How many graphs were captured (of one part: "attn_in", "attn_out_ffn", "block")."""
        return sum(isinstance(entry, _Captured) and part in (None, key[0]) for key, entry in self._entries.items())


def _address(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape), t.stride(), t.dtype


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """b is a: the copy would read and write the same bytes."""
    return _address(a) == _address(b)
