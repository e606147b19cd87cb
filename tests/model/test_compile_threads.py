"""compile_threads.launch_all: a worker's warm-up launches on threads, whose compiles overlap."""

import threading

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
