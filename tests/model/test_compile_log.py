"""bench/compile_log.watch: the Triton compile hooks that bench/h200.py counts a timed prefill's
compiles with and compile_log.py prints them by, each beside the hooks set before it (h200.py
runs under compile_log.py, and both watch)."""

import importlib.util
import pathlib

import pytest
import triton


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).parents[2] / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def hooks(monkeypatch):
    """Triton's two compile hooks, restored after the test; fire(key, cached) runs them as a
    launch's compile does: the first before (a truthy answer skips the compile), the second after."""
    runtime = triton.knobs.runtime
    monkeypatch.setattr(runtime, "jit_cache_hook", None)
    monkeypatch.setattr(runtime, "jit_post_compile_hook", None)

    def fire(key: str) -> bool:
        hook = dict(key=key, repr=f"{key}_kernel[num_warps=4](x: i32)", compile={"signature": {}})
        skip = runtime.jit_cache_hook(**hook)
        if not skip:
            runtime.jit_post_compile_hook(**hook)
        return bool(skip)
    return fire


def test_each_watcher_sees_every_compile_beside_the_hooks_before_it(hooks):
    compile_log = _load("compile_log")
    first, second = [], []
    compile_log.watch(lambda took, launch, compile: first.append((launch, compile)))
    compile_log.watch(lambda took, launch, compile: second.append(took >= 0))
    assert hooks("a") is False and hooks("b") is False
    assert [launch for launch, _ in first] == ["a_kernel[num_warps=4](x: i32)", "b_kernel[num_warps=4](x: i32)"]
    assert second == [True, True]


def test_a_hook_that_skips_the_compile_keeps_its_answer(hooks):
    compile_log = _load("compile_log")
    triton.knobs.runtime.jit_cache_hook = lambda **hook: True  # (a hook that supplies the kernel itself)
    seen = []
    compile_log.watch(lambda *args: seen.append(args))
    assert hooks("a") is True and seen == []


def test_h200_counts_the_compiles_inside_a_timed_run(hooks):
    h200 = _load("h200")
    h200.watch_compiles()
    hooks("warm")
    first = len(h200.COMPILES)
    hooks("late")
    hooks("late")
    inside = h200.compiles_since(first)
    assert inside["compiles_inside"] == 2 and inside["compiled_kernels"] == ["late_kernel"]
    assert 0 <= inside["compile_s_inside"] < 1
