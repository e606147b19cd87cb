"""Independent launches spread over CUDA streams in turn, so that one launch's last, partly
filled wave of programs runs beside the next one's first. (cuBLAS's FP8 products at a prefill
chunk are a few waves of persistent programs each: a routed expert's 2,048 rows at the
release's widths are 576 output tiles, 4.4 waves of the H100's 132 SMs, the last of them 36%
full, and the next product starts only when the last tile of this one ends.)"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch

_SIDE: dict[torch.device, list[torch.cuda.Stream]] = {}  # a device's side streams, made once


def _side_streams(device: torch.device, count: int) -> list[torch.cuda.Stream]:
    streams = _SIDE.setdefault(device, [])
    while len(streams) < count:
        streams.append(torch.cuda.Stream(device))
    return streams[:count]


@contextlib.contextmanager
def in_turns(device: torch.device, count: int) -> Iterator[Iterator[contextlib.AbstractContextManager]]:
    """Yields an endless cycle of stream contexts, the current stream's first, then count - 1
    side streams'; a launch enqueued inside the n-th context runs on its stream. On entry each
    side stream waits for the work queued so far on the current one; on exit (errors too) the
    current one waits for theirs. So tensors made before the block may be read and written
    inside it (keep a reference to each until the block ends: freed inside, the current
    stream's pool could hand its memory out again while a side stream still reads it), and
    what the block wrote is ready after it. What a side stream allocates inside returns to its
    own pool, in its own order. The current stream alone off the GPU, at count 1 and inside a
    CUDA graph capture."""
    if device.type != "cuda" or count <= 1 or torch.cuda.is_current_stream_capturing():
        yield itertools.repeat(contextlib.nullcontext())
        return
    main = torch.cuda.current_stream(device)
    sides = _side_streams(device, count - 1)
    for side in sides:
        side.wait_stream(main)
    try:
        yield (contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)
               for stream in itertools.cycle([None, *sides]))
    finally:
        for side in sides:
            main.wait_stream(side)
