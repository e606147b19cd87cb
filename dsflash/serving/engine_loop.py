"""A synchronous engine in its own thread, driven from asyncio.

The engine's step() does blocking model work, so it never runs on the event loop. RPC
handlers post commands with `call(fn)`; the thread runs them between steps (so the engine
is only ever touched by one thread), then steps while the engine has work and sleeps on an
event otherwise. Engines that share one model (`dsflash serve`: a prefill and a decode worker
in one process) take turns under the model's step lock.

A failed step fails the requests in flight (on_crash) and the loop goes on. If the thread
itself dies (outside a step), every queued and later call fails at once with the reason:
a request must get an error, never wait on a thread that is gone.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

log = logging.getLogger(__name__)


class EngineStopped(RuntimeError):
    """The engine thread is gone: what was asked of it cannot run."""


class EngineLoop:
    def __init__(self, name: str, step: Callable[[], None], has_work: Callable[[], bool],
                 on_crash: Callable[[BaseException], None] | None = None, device: torch.device | None = None,
                 lock: AbstractContextManager | None = None):
        """`device`: the model's GPU, made this thread's current one (CUDA keeps one per thread;
        a bare "cuda" is the current one of the thread that builds the loop).
        `lock`: held around each command and step (the model's step_lock)."""
        self.name = name
        if device is not None and device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._lock = lock if lock is not None else nullcontext()
        self._step, self._has_work, self._on_crash = step, has_work, on_crash
        # (command, what to call with the exception if it can never run)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self.failure: BaseException | None = None  # why the thread died, once it has
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

        def fail(exc: BaseException) -> None:
            loop.call_soon_threadsafe(settle, future.set_exception, exc)

        def run():
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting handler
                fail(exc)
            else:
                loop.call_soon_threadsafe(settle, future.set_result, result)

        self._enqueue(run, fail)
        return future

    def post(self, fn: Callable[[], object]) -> None:
        """Run fn() in the engine thread, not waiting for it (from any thread)."""
        self._enqueue(fn, None)

    def _enqueue(self, command: Callable[[], object], fail: Callable[[BaseException], None] | None) -> None:
        self._commands.put((command, fail))
        self._wake.set()
        if self.failure is not None:  # the thread is gone: nothing will take it from the queue
            self._fail_queued()

    def _run(self) -> None:
        try:
            if self.device is not None and self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            self._serve()
        except BaseException as exc:
            log.exception("engine %s thread died", self.name)
            self.failure = EngineStopped(f"engine {self.name} stopped: {exc!r}")
            if self._on_crash is not None:
                try:
                    self._on_crash(self.failure)
                except Exception:
                    log.exception("engine %s: failing the requests in flight failed", self.name)
            self._fail_queued()

    def _serve(self) -> None:
        while not self._stopping:
            while True:
                try:
                    command, fail = self._commands.get_nowait()
                except queue.Empty:
                    break
                try:
                    with self._lock:
                        command()
                except Exception as exc:  # a posted command that failed (call() hands its own back)
                    log.exception("engine %s command failed", self.name)
                    if fail is not None:
                        fail(exc)
            try:
                if self._has_work():
                    with self._lock:
                        self._step()
                    continue
            except Exception as exc:  # the worker fails the requests in flight, then goes on
                log.exception("engine %s step failed", self.name)
                if self._on_crash is not None:
                    self._on_crash(exc)
            self._wake.wait(0.05)
            self._wake.clear()

    def _fail_queued(self) -> None:
        while True:
            try:
                _, fail = self._commands.get_nowait()
            except queue.Empty:
                return
            if fail is not None:
                fail(self.failure)
