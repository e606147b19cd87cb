"""CUDA graphs of the dense parts of a forward, one per (part, layer, rows).

A decode step launches thousands of small kernels, and on the H200 the host's launch work, not
the GPU, sets its time. The dense parts of each mHC block (the gates, norms, projections,
router, experts) have shapes that depend only on the number of rows, so each is captured once
per row count and then replayed as a single launch. The per-request parts (RoPE, cache reads
and writes, compressor, indexer, attention) stay eager: their shapes follow each cache.

A part runs eagerly the first time its key is seen (Triton compiles, weights are packed and
cached), and is captured the second time. A part that cannot be captured (it synchronizes
with the host, say) runs eagerly from then on. Replays are bitwise the eager run: the same
kernels on the same shapes (tests/model/test_cuda_graphs.py).
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

    @staticmethod
    def wanted(device: torch.device) -> bool:
        return device.type == "cuda" and os.environ.get("DSFLASH_CUDA_GRAPHS", "1") != "0"

    def run(self, key: tuple, fn: Callable[..., Tensors], inputs: Tensors) -> Tensors:
        """fn(*inputs), replayed from a graph when this key was seen before. The returned
        tensors belong to the graph: use them before this key runs again."""
        if inputs[0].shape[0] > self.max_rows:
            return fn(*inputs)
        key = key + tuple(tuple(t.shape) for t in inputs)
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = "warm"
            return fn(*inputs)
        if entry == "warm":
            entry = self._entries[key] = self._capture(key, fn, inputs)
        if entry is _EAGER:
            return fn(*inputs)
        for static, given in zip(entry.inputs, inputs):
            static.copy_(given)
        entry.graph.replay()
        return entry.outputs

    def _capture(self, key: tuple, fn: Callable[..., Tensors], inputs: Tensors):
        static = tuple(t.clone() for t in inputs)
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
        return _Captured(graph, static, tuple(outputs))

    def captured(self) -> int:
        return sum(isinstance(entry, _Captured) for entry in self._entries.values())
