"""A synchronous engine in its own thread, driven from asyncio.

The engine's step() does blocking model work, so it never runs on the event loop. RPC
handlers post commands with `call(fn)`; the thread runs them between steps (so the engine
is only ever touched by one thread), then steps while the engine has work and sleeps on an
event otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)


class EngineLoop:
    def __init__(self, name: str, step: Callable[[], None], has_work: Callable[[], bool],
                 on_crash: Callable[[BaseException], None] | None = None, device: torch.device | None = None):
        """`device`: the model's GPU, made this thread's current one (CUDA keeps one per thread)."""
        self.name = name
        self.device = device
        self._step, self._has_work, self._on_crash = step, has_work, on_crash
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)

    def call(self, fn: Callable[[], object]) -> asyncio.Future:
        """Run fn() in the engine thread; await the returned future for its result."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def settle(setter, value):
            if not future.done():
                setter(value)

        def run():
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting handler
                loop.call_soon_threadsafe(settle, future.set_exception, exc)
            else:
                loop.call_soon_threadsafe(settle, future.set_result, result)

        self._commands.put(run)
        self._wake.set()
        return future

    def post(self, fn: Callable[[], object]) -> None:
        """Run fn() in the engine thread, not waiting for it (from any thread)."""
        self._commands.put(fn)
        self._wake.set()

    def _run(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while not self._stopping:
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                command()
            try:
                if self._has_work():
                    self._step()
                    continue
            except Exception as exc:  # the worker fails the requests in flight, then goes on
                log.exception("engine %s step failed", self.name)
                if self._on_crash is not None:
                    self._on_crash(exc)
            self._wake.wait(0.05)
            self._wake.clear()
