"""A decode worker whose engine thread dies answers at once with the reason, reports NOT_SERVING
and leaves the registry, so nothing waits on it and nothing is routed to it (`dsflash serve` on
a GPU once lost both engine threads at start and hung every request)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dsflash.decode_worker.server import DecodeWorker
from dsflash.decode_worker.service import sampling_from_proto
from dsflash.serving.engine_loop import EngineStopped
from dsflash.serving.worker import WorkerSettings
from dsflash.v1 import worker_pb2


class _Fatal(BaseException):
    """Not an Exception: it gets past the loop's per-command handling and ends the thread."""


def _die() -> None:
    raise _Fatal("device lost")


async def _health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        return reply.status


async def _scenario(checkpoint, model) -> None:
    settings = WorkerSettings(role="decode", checkpoint=str(checkpoint), host="127.0.0.1", heartbeat_s=0.05)
    worker = DecodeWorker(settings, model=model)
    _, port = await worker.start()
    try:
        directory = worker.runtime.directory
        assert await _health(port) == health_pb2.HealthCheckResponse.SERVING
        assert [w.worker_id for w in await directory.list_workers()] == [worker.runtime.worker_id]
        worker.loop.post(_die)
        sampling = worker_pb2.SamplingParams(max_tokens=4, temperature=0)
        request = worker_pb2.GenerateRequest(request_id="after-death", token_ids=list(range(3, 20)), sampling=sampling)
        began = time.monotonic()
        with pytest.raises(EngineStopped, match="device lost"):
            async for _ in worker.generate(request, list(request.token_ids), sampling_from_proto(request.sampling)):
                pass
        assert time.monotonic() - began < 5
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (await directory.list_workers()):
            await asyncio.sleep(0.05)
        assert await directory.list_workers() == []
        assert await _health(port) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await worker.close()


def test_a_dead_engine_fails_requests_and_leaves_the_registry(tiny_checkpoint, tiny_model):
    asyncio.run(_scenario(tiny_checkpoint, tiny_model))
