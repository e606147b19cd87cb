"""A real redis-server process on a free loopback port, for tests.

`RedisServer`: `.url`, `.stop()` (the process exits, its data is gone: it runs with no
persistence), `.start()` (again on the same port), `.pause()` / `.resume()` (SIGSTOP/SIGCONT:
the port stays open but nothing answers, the nastiest outage).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from dsflash.serving.worker import free_port

REDIS_SERVER = shutil.which("redis-server")


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, log_dir):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._log_path = log_dir / f"redis-{self.port}.log"
        self._process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 5.0) -> None:
        assert self._process is None, "already running"
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with open(self._log_path, "ab") as log:
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not _answers_ping(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: see {self._log_path}")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._process is None:
            return
        self.resume()
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def pause(self) -> None:
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGCONT)


def start_redis(log_dir) -> RedisServer:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    server = RedisServer(log_dir)
    server.start()
    return server
