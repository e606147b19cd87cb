"""A worker's gRPC port is its own (dsflash/serving/worker.py listening_server): grpc's default
SO_REUSEPORT would let a second server bind a port one already listens on, and the kernel would
split connections between the two (a parallel test run once sent a gateway's call to another
run's worker)."""

from __future__ import annotations

import asyncio
import errno

import grpc
import pytest

from dsflash.serving.worker import WorkerSettings, listening_server


def test_a_second_server_on_a_workers_port_is_refused_with_its_reason():
    async def check():
        first, port = listening_server(WorkerSettings(role="prefill", checkpoint="ckpt", host="127.0.0.1"))
        await first.start()
        try:
            assert port > 0  # port 0 in the settings: one the kernel picked
            with pytest.raises(OSError, match="decode worker cannot listen on 127.0.0.1:.*taken") as refused:
                listening_server(WorkerSettings(role="decode", checkpoint="ckpt", host="127.0.0.1", port=port))
            assert refused.value.errno == errno.EADDRINUSE
        finally:
            await first.stop(None)
        # what the option prevents: two servers with grpc's defaults share a port
        servers = [grpc.aio.server(), grpc.aio.server()]
        port = servers[0].add_insecure_port("127.0.0.1:0")
        await servers[0].start()
        assert servers[1].add_insecure_port(f"127.0.0.1:{port}") == port
        for server in servers:
            await server.stop(None)

    asyncio.run(check())
