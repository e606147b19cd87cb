"""EngineLoop: engines that share a model take turns (the model's step lock), so `dsflash serve`'s
prefill and decode workers never run a forward at the same time (CUDA graphs share buffers); an
engine thread that dies fails its callers at once instead of leaving them waiting."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dsflash.serving.engine_loop import EngineLoop, EngineStopped


class _Engine:
    """Steps that take a while and record how many engines were inside a step at once."""

    inside = 0
    most = 0
    guard = threading.Lock()

    def __init__(self, steps: int):
        self.left = steps

    def has_work(self) -> bool:
        return self.left > 0

    def step(self) -> None:
        with _Engine.guard:
            _Engine.inside += 1
            _Engine.most = max(_Engine.most, _Engine.inside)
        time.sleep(0.002)
        with _Engine.guard:
            _Engine.inside -= 1
        self.left -= 1


def _run_two(lock) -> int:
    _Engine.inside = _Engine.most = 0
    engines = [_Engine(40), _Engine(40)]
    loops = [EngineLoop(f"e{i}", e.step, e.has_work, lock=lock) for i, e in enumerate(engines)]
    for loop in loops:
        loop.start()
    deadline = time.monotonic() + 20
    while any(e.has_work() for e in engines) and time.monotonic() < deadline:
        time.sleep(0.01)
    for loop in loops:
        loop.stop()
    assert not any(e.has_work() for e in engines)
    return _Engine.most


def test_engines_sharing_a_lock_never_step_at_once():
    assert _run_two(threading.RLock()) == 1


def test_without_a_shared_lock_they_overlap():
    """The control: the check above can fail (two engines do overlap without the lock)."""
    assert _run_two(None) == 2


class _Fatal(BaseException):
    """Escapes the step's error handling: the thread dies (as it did on `set_device("cuda")`)."""


def test_a_dead_engine_thread_fails_every_call_at_once():
    crashed = []
    inside, go = threading.Event(), threading.Event()

    def dies_when_told() -> bool:  # the thread dies between steps, a call waiting in its queue
        inside.set()
        go.wait(5)
        raise _Fatal("no device")

    loop = EngineLoop("broken", lambda: None, dies_when_told, crashed.append)

    async def scenario():
        loop.start()
        assert inside.wait(5)
        queued = loop.call(lambda: 1)
        go.set()
        with pytest.raises(EngineStopped, match="no device"):  # queued as it died: failed, not left waiting
            await asyncio.wait_for(queued, 5)
        with pytest.raises(EngineStopped, match="no device"):  # and after it died
            await asyncio.wait_for(loop.call(lambda: 2), 5)

    asyncio.run(scenario())
    assert len(crashed) == 1 and isinstance(crashed[0], EngineStopped)
    loop.stop()


def test_a_failed_posted_command_leaves_the_loop_running():
    loop = EngineLoop("e", lambda: None, lambda: False)

    async def scenario():
        loop.start()
        loop.post(lambda: 1 / 0)
        assert await asyncio.wait_for(loop.call(lambda: 3), 5) == 3

    asyncio.run(scenario())
    assert loop.failure is None
    loop.stop()
