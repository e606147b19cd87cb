"""Real worker processes for tier tests: `dsflash prefill` / `dsflash decode` subprocesses on
loopback, driven over gRPC, with their logs kept for failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dsflash.serving.worker import GRPC_OPTIONS, free_port
from dsflash.v1 import worker_pb2, worker_pb2_grpc


class Worker:
    def __init__(self, role: str, checkpoint, log_dir, redis_url: str | None = None, extra: list[str] = ()):
        self.role, self.port = role, free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{role}-{self.port}.log"
        args = [sys.executable, "-m", "dsflash.cli", role, "--checkpoint", str(checkpoint), "--host", "127.0.0.1",
                "--port", str(self.port), "--pool-bytes", "48MiB", "--max-requests", "8"]
        if redis_url:
            args += ["--redis-url", redis_url]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args + list(extra), stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout_s: float = 60.0) -> "Worker":
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.role} worker exited:\n{self.log()}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=0.5).status == 1:
                        return self
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise TimeoutError(f"{self.role} worker not ready:\n{self.log()}")

    def status(self) -> worker_pb2.WorkerStatus:
        with grpc.insecure_channel(self.address) as channel:
            stub = (worker_pb2_grpc.PrefillStub if self.role == "prefill" else worker_pb2_grpc.DecodeStub)(channel)
            return stub.Status(worker_pb2.StatusRequest(), timeout=5)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def generate(address: str, tokens: list[int], *, conversation: str = "", max_tokens: int = 8, request_id: str = "",
             timeout_s: float = 120, history_drops_reply: bool = False,
             **sampling) -> tuple[list[int], worker_pb2.Finished]:
    params = worker_pb2.SamplingParams(max_tokens=max_tokens, **sampling)
    request = worker_pb2.GenerateRequest(request_id=request_id or f"t{time.monotonic_ns()}", token_ids=tokens,
                                         conversation_id=conversation, sampling=params,
                                         history_drops_reply=history_drops_reply)
    out, finished = [], None
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        for message in worker_pb2_grpc.DecodeStub(channel).Generate(request, timeout=timeout_s):
            if message.HasField("chunk"):
                out += list(message.chunk.token_ids)
            else:
                finished = message.finished
    return out, finished


def wait_for(predicate, timeout_s: float = 15.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError("condition not reached")
