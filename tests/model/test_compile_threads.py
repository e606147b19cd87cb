"""compile_threads.launch_all: a worker's warm-up launches on threads, whose compiles overlap."""

import threading
import time

import pytest
import torch

from dsflash.model.kernels import compile_threads


def test_off_the_gpu_the_launches_run_in_order_and_a_failure_stops_them():
    ran = []
    compile_threads.launch_all(torch.device("cpu"), [lambda i=i: ran.append(i) for i in range(5)], threads=4)
    assert ran == list(range(5))

    def fail():
        raise ValueError("the third")

    with pytest.raises(ValueError, match="the third"):
        compile_threads.launch_all(torch.device("cpu"), [lambda: ran.append(5), lambda: ran.append(6), fail,
                                                         lambda: ran.append(8)], threads=4)
    assert ran[5:] == [5, 6]


class _SlowLoadingKernel:
    """A compiled kernel as Triton's _init_handles makes its handles: the launcher first, then
    the module's load, which releases the GIL (here: a sleep)."""

    def __init__(self):
        self.function = self.module = self._run = None
        self.loads = 0

    def _init_handles(self):
        if self.module is not None:
            return
        self.loads += 1
        self._run = "launcher"
        time.sleep(0.05)
        self.module, self.function = "module", 1234


def test_a_kernel_launched_from_several_threads_first_has_its_function_in_each():
    """Every thread that asks for the launcher while another loads the module waits for the
    load: each then reads the function handle, and the module loads once."""
    kernel, seen = _SlowLoadingKernel(), []

    def launch():
        run = compile_threads._run_after_handles(kernel)
        seen.append((run, kernel.function))

    threads = [threading.Thread(target=launch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [("launcher", 1234)] * 8 and kernel.loads == 1


def test_triton_s_run_is_its_own_again_after_the_threads():
    from triton.compiler.compiler import CompiledKernel

    shipped = CompiledKernel.__dict__["run"]
    with compile_threads._handles_made_once():
        assert CompiledKernel.__dict__["run"].fget is compile_threads._run_after_handles
    assert CompiledKernel.__dict__["run"] is shipped


@pytest.mark.gpu
def test_one_kernel_and_shape_launched_first_from_eight_threads_runs_in_each(monkeypatch):
    """A kernel new to this process (its compile on disk after the first run), the same launch
    from 8 threads at once, on the caller's stream: each writes its own output."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)

    monkeypatch.setattr(compile_threads, "interpreting", lambda: False)
    outs = [torch.full((1000,), float(i), device="cuda") for i in range(16)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        compile_threads.launch_all(torch.device("cuda"), [lambda x=x: add_one[(8,)](x, 1000, BLOCK=128)
                                                         for x in outs], threads=8)
    assert all(torch.equal(x.cpu(), torch.full((1000,), i + 1.0)) for i, x in enumerate(outs))


@pytest.mark.gpu
def test_on_the_gpu_threads_run_every_launch_on_the_workers_gpu_and_raise_the_first_failure(monkeypatch):
    monkeypatch.setattr(compile_threads, "interpreting", lambda: False)
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    seen = []

    def launch(i):
        seen.append((i, threading.get_ident(), torch.cuda.current_device()))
        torch.ones(1, device="cuda").add_(i)

    def fail(message):
        raise ValueError(message)

    compile_threads.launch_all(device, [lambda i=i: launch(i) for i in range(16)], threads=4)
    assert sorted(i for i, _, _ in seen) == list(range(16))
    assert {gpu for _, _, gpu in seen} == {device.index}
    assert threading.get_ident() not in {thread for _, thread, _ in seen}
    with pytest.raises(ValueError, match="first"):
        compile_threads.launch_all(device, [lambda: fail("first"), lambda: launch(16), lambda: fail("second")],
                                   threads=2)
    assert 16 in {i for i, _, _ in seen}  # the others still ran


@pytest.mark.gpu
def test_the_top_k_compiled_on_threads_picks_as_torch_does(monkeypatch):
    """The top-k's warm-up for rows of up to 70,000 scores at k = 64 on 8 threads (its
    kernels compiled side by side, in each kernel's caches made before), then each plan's
    rows picked as torch.topk picks."""
    from triton.runtime.jit import JITFunction

    from dsflash.model.kernels import top_k

    monkeypatch.setattr(compile_threads, "interpreting", lambda: False)
    device = torch.device("cuda")
    compile_threads.launch_all(device, top_k.warm_up_launches(device, {64: 70000}), threads=8)
    kernels = [v for v in vars(top_k).values() if isinstance(v, JITFunction)]
    assert kernels and all(torch.cuda.current_device() in k.device_caches for k in kernels)
    for rows, N, k, chunks, filtered in top_k.warm_up_rows({64: 70000}):
        scores = torch.randn(rows, N, device=device)
        got = top_k.top_k_ascending_kernel(scores, k, chunks=chunks, filtered=filtered)
        assert torch.equal(got, torch.topk(scores, k, dim=1).indices.sort(dim=1).values)
