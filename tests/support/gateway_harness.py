"""Running the gateway for tests.

- `ScriptedGateway`: the real gateway app (uvicorn, real HTTP) in front of a scripted decode
  worker (a real gRPC server whose Generate streams a scripted token sequence). For behaviour
  a random model cannot show: tool calls, stop strings on known text, worker failures.
- `ServeProcess`: `dsflash serve` as a subprocess (real workers, real model).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time

import grpc
import httpx

from dsflash.gateway.endpoints import GatewaySettings
from dsflash.gateway.server import build_context, serve_http
from dsflash.serving.scripted import ScriptedDecode
from dsflash.serving.worker import free_port
from dsflash.v1 import worker_pb2, worker_pb2_grpc


class ScriptedGateway:
    def __init__(self, script, delay_s: float = 0.0, settings: GatewaySettings | None = None):
        self.backend = ScriptedDecode(script, delay_s)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings = settings or GatewaySettings(keepalive_s=0.2)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("gateway did not start")

    def _run(self):
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self):
        server = grpc.aio.server()
        worker_pb2_grpc.add_DecodeServicer_to_server(self.backend, server)
        decode = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        ctx, self._channels = build_context(self.settings, prefill=["127.0.0.1:1"], decode=[decode])
        self.ctx = ctx  # (a test may stand in for its router)
        self._stop = asyncio.Event()
        ready = asyncio.Event()
        http = asyncio.create_task(serve_http(ctx, "127.0.0.1", self.port, ready))
        await ready.wait()
        self._ready.set()
        await self._stop.wait()
        http.cancel()
        await server.stop(None)

    def close(self):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


class ServeProcess:
    def __init__(self, checkpoint, log_path, extra: list[str] = (), ready_timeout_s: float = 90.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        args = [sys.executable, "-m", "dsflash.cli", "serve", "--checkpoint", str(checkpoint), "--port", str(self.port),
                *extra]
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            self.decode_address = self._wait_ready(log_path, ready_timeout_s)
        except BaseException:
            self.close()  # a failed setup must not leave a server behind
            raise

    def _wait_ready(self, log_path, timeout_s: float) -> str:
        """The decode address from the serve_ready line. /readyz answers 200 a moment before
        that line is written, so both are waited for."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("dsflash serve exited:\n" + log_path.read_text()[-3000:])
            try:
                ready = httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                ready = False
            found = re.search(r"serve_ready .*decode=(\S+)", log_path.read_text()) if ready else None
            if found:
                return found.group(1)
            time.sleep(0.2)
        raise TimeoutError("dsflash serve not ready:\n" + log_path.read_text()[-3000:])

    def decode_status(self) -> worker_pb2.WorkerStatus:
        with grpc.insecure_channel(self.decode_address) as channel:
            return worker_pb2_grpc.DecodeStub(channel).Status(worker_pb2.StatusRequest(), timeout=5)

    def close(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
