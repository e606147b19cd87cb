"""Prefill and decode workers on a GPU (`--gpus 0`, Triton kernels, the KV pool on the GPU where
the attention and indexer kernels read it, staged through host memory handed over TCP) produce
the tokens the same model produces in-process. (Faithful mode, `--act-quant`, is not compared
here: on the H200 its served tokens left the in-process dense-cache greedy at the third token,
see docs/performance.md, fourth session.)"""

from __future__ import annotations

import httpx
import pytest
import torch

from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.model.runner import greedy

from tests.support.gateway_harness import ServeProcess

from .cluster import Worker, generate

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_gpu_workers_match_the_in_process_model(tiny_checkpoint, tmp_path):
    prefill = Worker("prefill", tiny_checkpoint, tmp_path, extra=["--gpus", "0", "--kv-transports", "tcp"])
    decode = Worker("decode", tiny_checkpoint, tmp_path,
                    extra=["--gpus", "0", "--kv-transports", "tcp", "--prefill", prefill.address])
    try:
        prefill.wait_ready(120)
        decode.wait_ready(120)
        for worker in (prefill, decode):  # `--kv-pool auto`: a GPU model's pool is on its GPU
            assert "pool_device=cuda:0 pool_staging=host staging_pinned=True" in worker.log_path.read_text(), worker.log()
            assert "precision=exact" in worker.log_path.read_text(), worker.log()
        assert "decode warmed up for batches of [1, 2, 4" in decode.log_path.read_text(), decode.log()  # warmup.py
        prompt = [(7 * i + 3) % 1000 + 5 for i in range(40)]
        out, finished = generate(decode.address, prompt, max_tokens=8, ignore_eos=True, temperature=0, timeout_s=120)
        assert finished.stats.prefill_worker == prefill.address and finished.stats.transport == "tcp"
        model = DeepseekV41.from_checkpoint(tiny_checkpoint, device="cuda")
        model.use_kernels()
        with torch.inference_mode():
            assert out == greedy(model, torch.tensor(prompt), 8)
    finally:
        prefill.stop()
        decode.stop()


def test_serve_on_a_gpu_runs_the_kernels(tiny_checkpoint, tmp_path):
    """`dsflash serve --device cuda` loads the model as the workers do: the Triton kernels and
    CUDA graphs (it once kept the reference path on the GPU), and answers a chat request."""
    serve = ServeProcess(tiny_checkpoint, tmp_path / "serve.log", extra=["--device", "cuda"], ready_timeout_s=300)
    try:
        assert "ops=kernels" in serve.log_path.read_text(), serve.log_path.read_text()[-3000:]
        reply = httpx.post(f"{serve.url}/v1/chat/completions", timeout=120,
                           json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1, reply.text
    finally:
        serve.close()
