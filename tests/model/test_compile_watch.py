"""model/kernels/compile_watch: Triton's compile hooks as bench/compile_log.py prints them,
bench/h200.py counts a timed prefill's compiles and a GPU worker logs those it makes while
serving, each watcher beside the hooks set before it (h200.py runs under compile_log.py, and
`dsflash serve`'s tiers share a process)."""

import logging

import pytest
import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from dsflash.model.kernels import compile_watch, top_k
from dsflash.serving import worker
from tests.support.bench_scripts import bench_script


@pytest.fixture
def fire(monkeypatch):
    """Triton's two compile hooks, restored after the test; fire(name) runs them as a launch's
    compile does: the first before (a truthy answer skips the compile), the second after.
    Returns whether the compile was skipped."""
    runtime = triton.knobs.runtime
    monkeypatch.setattr(runtime, "jit_cache_hook", None)
    monkeypatch.setattr(runtime, "jit_post_compile_hook", None)

    def run(name: str) -> bool:
        hook = dict(key=name, repr=f"{name}_kernel[num_warps=4](x: i32)", compile={"signature": {}})
        skip = runtime.jit_cache_hook(**hook) if runtime.jit_cache_hook else None  # (Triton: no hook, no call)
        if not skip and runtime.jit_post_compile_hook:
            runtime.jit_post_compile_hook(**hook)
        return bool(skip)
    return run


def test_each_watcher_sees_every_compile_beside_the_hooks_before_it(fire):
    first, second = [], []
    compile_watch.watch(lambda took, launch, compile: first.append(compile_watch.kernel_name(launch)))
    compile_watch.watch(lambda took, launch, compile: second.append(took >= 0))
    assert fire("a") is False and fire("b") is False
    assert first == ["a_kernel", "b_kernel"] and second == [True, True]


def test_a_hook_that_skips_the_compile_keeps_its_answer(fire):
    triton.knobs.runtime.jit_cache_hook = lambda **hook: True  # (a hook that supplies the kernel itself)
    seen = []
    compile_watch.watch(lambda *args: seen.append(args))
    assert fire("a") is True and seen == []


def test_h200_counts_the_compiles_inside_a_timed_run(fire):
    h200 = bench_script("h200.py")
    h200.watch_compiles()
    fire("warm")
    first = len(h200.COMPILES)
    fire("late")
    fire("late")
    inside = h200.compiles_since(first)
    assert inside["compiles_inside"] == 2 and inside["compiled_kernels"] == ["late_kernel"]
    assert 0 <= inside["compile_s_inside"] < 1


def test_a_worker_logs_the_compiles_after_every_warm_up_ends(fire, monkeypatch, caplog):
    """`dsflash serve`'s two GPU workers warm up one after the other in one process: the first
    one's end starts the watch (once), the second's warm-up compiles are not logged, a request's
    compile after both is."""
    monkeypatch.setattr(worker, "_COMPILES", {"watched": False, "warming": 0})
    caplog.set_level(logging.INFO, logger="dsflash.worker")
    with worker.warming_up():
        fire("prefill_warm_up")
    with worker.warming_up():
        fire("decode_warm_up")
    with worker.warming_up():  # a third warm-up: still one watch
        pass
    fire("late")
    lines = [r.getMessage() for r in caplog.records if "kernel_compiled_while_serving" in r.getMessage()]
    assert len(lines) == 1 and "kernel=late_kernel" in lines[0] and "seconds=" in lines[0] and "variant=" in lines[0]


def test_a_variant_names_its_constants_alignments_and_constexprs():
    """As Triton 3.6's hooks pass them: constants and configs keyed by argument paths."""
    compile = {"signature": {"x_ptr": "*fp32", "n": "i32", "rows": "i32", "BLOCK": "constexpr", "PDL": "constexpr"},
               "constants": {(2,): 1, (3,): 128, (4,): True},
               "configs": [{(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}]}
    assert compile_watch.variant(compile) == "ones=['rows'] aligned=['x_ptr', 'n'] constexprs={'BLOCK': 128, 'PDL': True}"
    assert compile_watch.variant({"signature": {}, "configs": "other"}) == "other"  # another Triton's arguments


def test_the_cpu_coverage_tool_keys_a_launch_as_triton_specializes_it():
    """bench/warm_up_coverage.py (the interpreter's launches keyed as Triton's JIT would key
    them): integers by being 1 and 16 dividing them unless unspecialized, pointers by their
    alignment, constexprs by value."""
    if not isinstance(top_k._filter_kernel, InterpretedFunction):
        pytest.skip("the tool keys the interpreter's launches (TRITON_INTERPRET=1)")
    coverage = bench_script("warm_up_coverage.py", "warm_up_coverage")
    x = torch.zeros(64)

    def key(chunk_len=32, chunks=16, x_ptr=x, BLOCK=1024):
        args = (x_ptr, x, x, x, x, x, 64, 64, chunk_len, chunks, 5)
        return coverage.variant_key(top_k._filter_kernel, args, dict(CAPACITY=1024, BLOCK=BLOCK, STAGES=3,
                                                                      ATOMIC=True, PDL=False, num_warps=4))
    assert key() == key(chunks=17) == key(chunks=1)  # FILTER_UNSPECIALIZED
    assert len({key(), key(chunk_len=33), key(chunk_len=1), key(x_ptr=x[1:]), key(BLOCK=512)}) == 5
