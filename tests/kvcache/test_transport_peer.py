"""The far side of the transport contract tests: an engine in its own process.

`python test_transport_peer.py KIND` starts an engine of KIND ("tcp", "shm", "rdma") with one
segment "kv" filled from seed 1, prints its endpoint, then answers one JSON command per line
on stdin (fill, digests, allocate, endpoint, rdma_accept, close). `ProcessPeer` drives such a
process (and can SIGSTOP / SIGKILL it); `InProcessPeer` gives a fake engine the same face, so
one contract suite covers every kind. This module holds no tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from dsflash.kvcache.transport import (FakeFabric, FakeTransferEngine, ShmTransferEngine,
                                       TcpTransferEngine, TransportConfig, make_compatibility_hash)
from dsflash.v1 import kvcache_pb2 as pb

SEGMENT_BYTES = 16 << 20
COMPAT = make_compatibility_hash("test-model", "fp8", "layout-v1")
REPLY_TIMEOUT_S = 30.0


def make_config(compatibility_hash: str = COMPAT) -> TransportConfig:
    # Stripes from 2 x 1 MiB up: the contract's larger batches move as up to 3 parallel stripes.
    return TransportConfig(compatibility_hash=compatibility_hash, connect_timeout_s=1.0,
                           stall_timeout_s=1.0, streams=3, min_stripe_bytes=1 << 20)


def pattern(seed: int, nbytes: int = SEGMENT_BYTES) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def digest(data: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(data).data).hexdigest()


def make_engine(kind: str, fabric: FakeFabric | None = None, rdma_handshake=None, **kwargs):
    config = kwargs.pop("config", None) or make_config()
    if kind == "fake":
        return FakeTransferEngine(config, fabric, **kwargs)
    if kind == "tcp":
        return TcpTransferEngine(config, **kwargs)
    if kind == "shm":
        return ShmTransferEngine(config, **kwargs)
    if kind == "rdma":
        from dsflash.kvcache.transport.rdma import RdmaTransferEngine

        return RdmaTransferEngine(config, rdma_handshake, **kwargs)
    raise ValueError(kind)


class _Commands:
    """What a peer does on request; shared by the process and the in-process peer."""

    def __init__(self, engine):
        self.engine = engine
        self.engine.allocate_segment("kv", SEGMENT_BYTES).numpy()[:] = pattern(1)

    def fill(self, seed: int) -> dict:
        self.engine.segment("kv").numpy()[:] = pattern(seed)
        return {}

    def digests(self, regions: list) -> dict:
        return {"digests": [digest(self.engine.segment(s).numpy()[o:o + n]) for s, o, n in regions]}

    def allocate(self, name: str, size: int, seed: int) -> dict:
        self.engine.allocate_segment(name, size).numpy()[:] = pattern(seed, size)
        return {}

    def seal(self, regions: list) -> dict:
        """Seal the checksums of these regions' bytes as they are now (as a KV pool does)."""
        for s, o, n in regions:
            self.engine.sealed.seal(s, o, self.engine.segment(s).numpy()[o:o + n])
        return {}

    def unseal(self, regions: list) -> dict:
        for s, o, _ in regions:
            self.engine.sealed.drop(s, [o])
        return {}

    def endpoint(self) -> dict:
        return {"endpoint": self.engine.endpoint().SerializeToString().hex()}

    def rdma_accept(self, request: str) -> dict:
        response = self.engine.accept(pb.RdmaConnectRequest.FromString(bytes.fromhex(request)))
        return {"response": response.SerializeToString().hex()}


def leak_report() -> dict:
    """What a closed engine must not leave behind in its process."""
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    with open("/proc/self/maps") as maps:
        mapped = [line for line in maps if "dsflash-kv" in line]
    return {"threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("kv-")),
            "memfds": [f for f in fds if "dsflash-kv" in f],
            "sockets": sum(f.startswith("socket:") for f in fds),
            "mapped": mapped,
            "shm_files": [f for f in os.listdir("/dev/shm") if "dsflash" in f]}


def serve(kind: str) -> None:
    commands = _Commands(make_engine(kind))
    print(json.dumps(commands.endpoint()), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        name = request.pop("cmd")
        if name == "close":
            commands.engine.close()
            del commands
            import gc

            gc.collect()
            print(json.dumps(leak_report()), flush=True)
            return
        print(json.dumps(getattr(commands, name)(**request)), flush=True)


class ProcessPeer:
    def __init__(self, kind: str):
        self.kind = kind
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), kind],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._replies: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.endpoint = self._endpoint(self._reply())

    def _read(self) -> None:
        for line in self.process.stdout:
            self._replies.put(json.loads(line))
        self._replies.put(None)  # the process exited

    def _reply(self) -> dict:
        reply = self._replies.get(timeout=REPLY_TIMEOUT_S)
        if reply is None:
            raise RuntimeError(f"{self.kind} peer process exited")
        return reply

    @staticmethod
    def _endpoint(reply: dict) -> pb.TransportEndpoint:
        return pb.TransportEndpoint.FromString(bytes.fromhex(reply["endpoint"]))

    def call(self, cmd: str, **args) -> dict:
        self.process.stdin.write((json.dumps({"cmd": cmd, **args}) + "\n").encode())
        self.process.stdin.flush()
        return self._reply()

    def fill(self, seed: int) -> None:
        self.call("fill", seed=seed)

    def digests(self, regions) -> list[str]:
        return self.call("digests", regions=[list(r) for r in regions])["digests"]

    def allocate(self, name: str, size: int, seed: int) -> None:
        self.call("allocate", name=name, size=size, seed=seed)

    def seal(self, regions) -> None:
        self.call("seal", regions=[list(r) for r in regions])

    def unseal(self, regions) -> None:
        self.call("unseal", regions=[list(r) for r in regions])

    def refresh_endpoint(self) -> pb.TransportEndpoint:
        self.endpoint = self._endpoint(self.call("endpoint"))
        return self.endpoint

    def rdma_accept(self, request: pb.RdmaConnectRequest) -> pb.RdmaConnectResponse:
        reply = self.call("rdma_accept", request=request.SerializeToString().hex())
        return pb.RdmaConnectResponse.FromString(bytes.fromhex(reply["response"]))

    def pause(self) -> None:
        """SIGSTOP, and wait until every thread is stopped (the signal lands asynchronously)."""
        os.kill(self.process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5.0
        while not self._all_stopped() and time.monotonic() < deadline:
            time.sleep(0.005)

    def _all_stopped(self) -> bool:
        tasks = f"/proc/{self.process.pid}/task"
        states = []
        for tid in os.listdir(tasks):
            with open(f"{tasks}/{tid}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
        return all(state in "Tt" for state in states)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def close(self) -> dict:
        """Close the engine; returns the peer process's leak report."""
        report = self.call("close")
        self.process.wait(10)
        return report

    def __del__(self):
        if self.process.poll() is None:
            self.process.kill()


class InProcessPeer(_Commands):
    """A fake engine on a fabric, with ProcessPeer's interface (kill = engine closed)."""

    kind = "fake"

    def __init__(self, fabric: FakeFabric):
        super().__init__(make_engine("fake", fabric))
        self.endpoint = self.engine.endpoint()

    def refresh_endpoint(self) -> pb.TransportEndpoint:
        self.endpoint = self.engine.endpoint()
        return self.endpoint

    def digests(self, regions) -> list[str]:
        return super().digests(regions)["digests"]

    def allocate(self, name: str, size: int, seed: int) -> None:
        super().allocate(name, size, seed)

    def kill(self) -> None:
        self.engine.close()

    def close(self) -> dict:
        self.engine.close()
        return {"threads": [], "memfds": [], "sockets": 0, "mapped": [], "shm_files": []}


if __name__ == "__main__":
    serve(sys.argv[1])
