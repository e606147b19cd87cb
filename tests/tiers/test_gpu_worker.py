"""Prefill and decode workers on a GPU (`--gpus 0`, Triton kernels, the KV pool on the GPU where
the attention and indexer kernels read it, staged through host memory handed over TCP) produce
the tokens the same model produces in-process, in both precisions.

Exact mode is compared with the dense-cache greedy (the gathering reference attention). Faithful
mode (`--act-quant`) is compared with the in-process greedy on a GPU pool, the kernels the
workers run: its FP8 rounding of every GEMM input turns the kernel attention's last-bit
differences from the reference (tf32 parts, hardware exp) into whole-step flips at near ties
(measured on the H200, bench/faithful_paths.py: the dense path left the paged one at the third
token, where its top-2 margin was 0.06; the paged path, the engine and the engine with DSpark
agreed token for token, as every path does in both modes under the CPU interpreter)."""

from __future__ import annotations

import httpx
import pytest
import torch

from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.paged import PagedCache
from dsflash.kvcache.pool import CachePool, plain_allocator
from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.model.runner import greedy

from tests.support.gateway_harness import ServeProcess

from .cluster import Worker, generate, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.parametrize("precision", ["exact", "faithful"])
def test_gpu_workers_match_the_in_process_model(tiny_checkpoint, tmp_path, precision):
    faithful = precision == "faithful"
    flags = ["--gpus", "0", "--kv-transports", "tcp"] + (["--act-quant"] if faithful else [])
    prefill = Worker("prefill", tiny_checkpoint, tmp_path, extra=flags)
    decode = Worker("decode", tiny_checkpoint, tmp_path, extra=flags + ["--prefill", prefill.address])
    try:
        # (the warm-ups' compiles, on an empty Triton cache with the other tests' workers beside
        # them: a prefill worker missed 120 s, H100, fifty-eighth session's call BB)
        prefill.wait_ready(300)
        decode.wait_ready(300)
        for worker in (prefill, decode):  # `--kv-pool auto`: a GPU model's pool is on its GPU
            assert "pool_device=cuda:0 pool_staging=host staging_pinned=True" in worker.log_path.read_text(), worker.log()
            assert f"precision={'act-quant' if faithful else 'exact'}" in worker.log_path.read_text(), worker.log()
        assert "decode warmed up for batches of [1, 2, 4" in decode.log_path.read_text(), decode.log()  # warmup.py
        assert "prefill_warm_up tokens=" in prefill.log_path.read_text(), prefill.log()  # one chunk at start
        prompt = [(7 * i + 3) % 1000 + 5 for i in range(37)]  # a length the prefill warm-up skips
        out, finished = generate(decode.address, prompt, max_tokens=8, ignore_eos=True, temperature=0, timeout_s=120,
                                 conversation="c")
        assert finished.stats.prefill_worker == prefill.address and finished.stats.transport == "tcp"
        assert out == _in_process_greedy(tiny_checkpoint, prompt, 8, faithful)
        # the next turn: the prefill worker extends the decode worker's cache of the first
        held = len(prompt) + len(out) - 1
        wait_for(lambda: decode.status().host_cache_entries >= 1)
        _, finished = generate(decode.address, prompt + out + [(11 * i + 2) % 1000 + 5 for i in range(23)],
                               max_tokens=8, ignore_eos=True, temperature=0, timeout_s=120, conversation="c")
        assert finished.usage.cached_tokens == held, finished
        for worker in (prefill, decode):  # the warm-ups compiled every kernel variant the requests took
            assert "kernel_compiled_while_serving" not in worker.log_path.read_text(), worker.log()
    finally:
        prefill.stop()
        decode.stop()


def _in_process_greedy(checkpoint, prompt: list[int], steps: int, faithful: bool) -> list[int]:
    """Greedy tokens of the kernel-path model: exact mode on a dense cache (the reference
    attention), faithful mode on a GPU pool (the kernels the workers run; see the docstring)."""
    model = DeepseekV41.from_checkpoint(checkpoint, device="cuda", act_quant=faithful)
    model.use_kernels()
    cache = None
    if faithful:
        layout = CacheLayout.for_model(model.config, page_entries=64)
        cache = PagedCache(CachePool(layout, 200, 4, plain_allocator(model.device)), model.config)
    with torch.inference_mode():
        return greedy(model, torch.tensor(prompt), steps, cache=cache)


def test_serve_on_a_gpu_runs_the_kernels(tiny_checkpoint, tmp_path):
    """`dsflash serve --device cuda` loads the model as the workers do: the Triton kernels and
    CUDA graphs (it once kept the reference path on the GPU), and answers a chat request."""
    serve = ServeProcess(tiny_checkpoint, tmp_path / "serve.log", extra=["--device", "cuda"], ready_timeout_s=300)
    try:
        assert "ops=kernels" in serve.log_path.read_text(), serve.log_path.read_text()[-3000:]
        reply = httpx.post(f"{serve.url}/v1/chat/completions", timeout=120,
                           json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1, reply.text
        assert "kernel_compiled_while_serving" not in serve.log_path.read_text(), serve.log_path.read_text()[-5000:]
    finally:
        serve.close()
