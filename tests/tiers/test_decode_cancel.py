"""A client that goes away must stop the decode engine, wherever the cancel lands.

gRPC closes a streaming handler in one of two ways: CancelledError while it waits for the
next token, or GeneratorExit at the `yield` of a chunk when the cancel arrives while the
chunk is being sent. Under CI load the second happened and the engine decoded 500 tokens for
nobody. Both paths are driven here in-process, deterministically."""

from __future__ import annotations

import asyncio
import time

import pytest

from dsflash.decode_worker.server import DecodeWorker
from dsflash.decode_worker.service import sampling_from_proto
from dsflash.serving.worker import WorkerSettings
from dsflash.v1 import worker_pb2


def _request(request_id: str) -> worker_pb2.GenerateRequest:
    sampling = worker_pb2.SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    return worker_pb2.GenerateRequest(request_id=request_id, token_ids=list(range(3, 40)), sampling=sampling)


async def _engine_idle(worker: DecodeWorker, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not worker.engine.has_work():
            return True
        await asyncio.sleep(0.02)
    return False


async def _run(checkpoint, model, how: str) -> tuple[bool, int, int]:
    settings = WorkerSettings(role="decode", checkpoint=str(checkpoint), host="127.0.0.1", heartbeat_s=60.0)
    worker = DecodeWorker(settings, model=model)
    await worker.start()
    try:
        free_before = worker.runtime.pool.free_page_count
        request = _request(f"cancel-{how}")
        stream = worker.generate(request, list(request.token_ids), sampling_from_proto(request.sampling))
        first = await anext(stream)
        assert first.HasField("chunk") and first.chunk.token_ids
        if how == "close":  # cancel while gRPC sends a chunk: GeneratorExit at the yield
            await stream.aclose()
        else:  # cancel while waiting for the next token: CancelledError at the await
            while True:  # a task still pending after one loop turn is parked on the token queue
                waiting = asyncio.ensure_future(anext(stream))
                await asyncio.sleep(0)
                if not waiting.done():
                    break
                assert waiting.result().HasField("chunk")
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        idle = await _engine_idle(worker)
        return idle, free_before, worker.runtime.pool.free_page_count
    finally:
        await worker.close()


@pytest.mark.parametrize("how", ["close", "cancel"])
def test_going_away_aborts_the_request(tiny_checkpoint, tiny_model, how):
    idle, free_before, free_after = asyncio.run(_run(tiny_checkpoint, tiny_model, how))
    assert idle, "the engine kept decoding for a client that went away"
    assert free_after == free_before  # the aborted request's pages came back
